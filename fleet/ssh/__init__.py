"""How fleet reaches a host: the SSH transport on paramiko, the OpenSSH client config, proxies,
known_hosts and certificates. The only package that imports paramiko.

May import: fleet.core.
"""
