# fleet checkpoints: node-side facts about an output dir, read-only. Run as
# `sh -c "$(cat probe.sh)" fleet-checkpoints MODE ARGS...`; no python needed but for `crc`.
#   free DIR      bytes free on DIR's filesystem
#   writing DIR   files under DIR some process holds open for writing, NUL-terminated
#   hash PATH...  "INDEX SHA256" per path (INDEX from 0; "INDEX -" if unreadable)
#   crc PATH...   "INDEX ok|bad|error" per zip (every member's CRC, python3's zipfile, which
#                 never unpickles); one line "nocheck" when the node has no python3
set -u
mode=$1
shift
case $mode in
free)
  df -Pk -- "$1" 2>/dev/null | awk 'NR == 2 { printf "%.0f\n", $4 * 1024 }'
  ;;
writing)
  dir=${1%/}
  for fd in /proc/[0-9]*/fd/*; do
    target=$(readlink "$fd" 2>/dev/null) || continue
    case $target in "$dir"/*) ;; *) continue ;; esac
    pid=${fd#/proc/}
    pid=${pid%%/*}
    flags=$(sed -n 's/^flags:[[:space:]]*//p' "/proc/$pid/fdinfo/${fd##*/}" 2>/dev/null)
    # O_ACCMODE is the last octal digit: 1 O_WRONLY, 2 O_RDWR
    case $flags in *[123]) printf '%s\0' "$target" ;; esac
  done
  ;;
hash)
  i=0
  for p in "$@"; do
    h=$(sha256sum <"$p" 2>/dev/null | cut -c1-64)
    printf '%s %s\n' "$i" "${h:--}"
    i=$((i + 1))
  done
  ;;
crc)
  if ! command -v python3 >/dev/null 2>&1; then
    echo nocheck
    exit 0
  fi
  # A zip whose end record claims more members than a checkpoint has (fleet reads at most
  # 262144: fleet/checkpoints/zipdir.py) is bad unread: zipfile would hold an object per
  # member. Any other zip that needs more than 1 GiB of address space is an error, not a
  # node out of memory.
  exec python3 -c '
import resource, sys, zipfile
soft, hard = resource.getrlimit(resource.RLIMIT_AS)
cap = 1 << 30 if soft == resource.RLIM_INFINITY else min(soft, 1 << 30)
if hard == resource.RLIM_INFINITY or hard >= cap:
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
end_record = getattr(zipfile, "_EndRecData", None)
for i, path in enumerate(sys.argv[1:]):
    try:
        if end_record is not None:
            with open(path, "rb") as f:
                end = end_record(f)
            if end is not None and end[4] > 262144:
                print(i, "bad", flush=True)
                continue
        with zipfile.ZipFile(path) as z:
            print(i, "ok" if z.testzip() is None else "bad", flush=True)
    except Exception:
        print(i, "error", flush=True)
' "$@"
  ;;
*)
  echo "fleet-checkpoints: unknown mode $mode" >&2
  exit 2
  ;;
esac
