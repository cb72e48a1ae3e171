"""What each verb does, as jobs of plans: the one execution path (jobs.perform: dry run, question,
secrets, runs), cleanup and its preview, launch and its rollback, status and its watch.

Features at this level (new verbs, e.g. push/pull or checkpoints) live here or beside it as
packages of the same layer. Speaks to the operator through the Terminal it is handed, never
through click.

May import: fleet.engine and everything below it. Never fleet.cli or click.
"""
