"""The shared vocabulary, the bottom layer: values and rules every other package speaks.

Errors and exit codes, built-in defaults, events and outcomes, hosts, steps and playbooks, shell
command values, the output frame, node sets, safe text, redaction, the bounded file and YAML
readers and the one rule for files fleet reads unasked. Pure or nearly so.

May import: the standard library, PyYAML, ClusterShell; nothing else of fleet (no ssh, no output,
no click, rich or paramiko).
"""
