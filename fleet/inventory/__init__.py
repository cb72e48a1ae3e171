"""Where hosts and their variables come from: Ansible inventories (YAML, JSON, INI, directories,
group_vars/host_vars), -w node sets and hostfiles, and host patterns (--limit).

May import: fleet.core, and fleet.ssh's option tables (an inventory's ansible_ssh_args are checked
against the same table as an ssh config). Never the engine, the output or the CLI.
"""
