"""parallel-ssh peer for bench/run.py: run one command on every host, exit 0 only if all succeed.

    python bench/peers/pssh_run.py --hosts-file H --key K --pool F 'true'

Uses pssh.clients.ParallelSSHClient (the native client on ssh2-python/libssh2, gevent inside one
process). Note: parallel-ssh verifies no host keys at all (fleet and the OpenSSH-based peers keep
strict checking on); the benchmark reports that difference rather than hiding it.
"""

from __future__ import annotations

import argparse
import sys

from pssh.clients import ParallelSSHClient  # type: ignore[import-untyped]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts-file", required=True, help="one address per line")
    ap.add_argument("--key", required=True, help="private key file")
    ap.add_argument("--user", default="root")
    ap.add_argument("--pool", type=int, default=32, help="pool_size: hosts worked on at once")
    ap.add_argument("--timeout", type=float, default=30)
    ap.add_argument("command")
    args = ap.parse_args()
    with open(args.hosts_file, encoding="utf-8") as fh:
        hosts = [line.strip() for line in fh if line.strip()]
    client = ParallelSSHClient(
        hosts,
        user=args.user,
        pkey=args.key,
        pool_size=args.pool,
        num_retries=3,
        timeout=args.timeout,
        allow_agent=False,
    )
    output = client.run_command(args.command, stop_on_errors=False)
    client.join(output)
    failed = 0
    for host_out in output:
        for _ in host_out.stdout or ():  # drain, like every other tool reads its output
            pass
        if host_out.exception is not None or host_out.exit_code != 0:
            failed += 1
            print(
                f"{host_out.host}: exit {host_out.exit_code} {host_out.exception or ''}",
                file=sys.stderr,
            )
    print(f"pssh: {len(hosts) - failed} ok, {failed} failed", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
