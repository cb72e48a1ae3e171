#!/bin/sh
# fleet/remote/status.sh: read-only facts for `fleet status`, as key=value lines.
#
#   sh -s -- gpus                 GPU memory and utilisation (when nvidia-smi exists)
#   sh -s -- disk [--dir DIR]     free space on DIR's filesystem and its type
#   sh -s -- processes --pattern ERE...
#                                 training processes: what matches (as cleanup matches) and its
#                                 descendants, but pid 1 (facts.sh's full records)
# shellcheck disable=SC2034 # read by die_usage (lib.sh)
SCRIPT=status.sh
# fleet:source lib.sh
# fleet:include facts.sh as FACTS_SH

# processes ARGS: `training=N pids=P1,P2,...`. fleet's own processes, which carry the patterns
# in their argv, are never counted: the status steps run marked as fleet's own
# (FLEET_NODE_HELPER, `helper: true`), and facts.sh leaves out those marked by fleet's uids.
processes() {
    pr_out=$(printf '%s\n' "$FACTS_SH" | FLEET_NODE_HELPER=1 sh -s -- "$@") || exit 2
    case $pr_out in *"$NL"'error grep'*)
        echo "status.sh: the node's grep -E rejects the patterns" >&2
        exit 1
        ;;
    esac
    pr_pids=$(printf '%s\n' "$pr_out" | sed -n 's/^p \([0-9]*\) .*/\1/p' | grep -v -x 1 | sort -n)
    printf 'training=%s pids=%s\n' "$(printf '%s' "$pr_pids" | grep -c .)" \
        "$(printf '%s' "$pr_pids" | tr '\n' ,)"
}
gpus() {
    command -v nvidia-smi >/dev/null 2>&1 || { say "gpus=none reason=no-nvidia-smi" && return 0; }
    # timeout: a GPU fallen off the bus hangs nvidia-smi, and the step's own timeout would take
    # the whole node for timed out. Its words go to stderr: the facts are the last stdout line.
    out=$(timeout 20 nvidia-smi --query-gpu=index,memory.used,memory.total,utilization.gpu \
        --format=csv,noheader,nounits 2>&1) || {
        [ "$?" -eq 124 ] && why=timed-out || why=failed
        printf '%s\n' "$out" | tail -n 3 >&2
        say "gpus=error reason=nvidia-smi-$why"
        return 1
    }
    printf '%s\n' "$out" | awk -F', *' '
        NF >= 4 { n++; used += $2; total += $3; util += $4
                  printf "gpu index=%s mem_used_mib=%s mem_total_mib=%s util_pct=%s\n", $1, $2, $3, $4 }
        END { if (n) printf "gpus=%d mem_used_mib=%d mem_total_mib=%d util_avg_pct=%d\n", n, used, total, util / n
              else print "gpus=0" }'
}
disk() {
    case $#:${1-} in 0:) ;; 2:--dir) ;; *) die_usage "usage: disk [--dir DIR]" ;; esac
    tilde "${2-}"
    dir=$TILDE
    [ -n "$dir" ] || { say "disk=unknown reason=no-output-dir" && return 0; }
    [ -d "$dir" ] || { say "disk=missing dir=$dir" && return 0; }
    fs=$(stat -f -c %T "$dir" 2>/dev/null || echo unknown)
    df -Pk "$dir" | awk -v d="$dir" -v fs="$fs" 'NR == 2 {
        printf "disk=ok dir=%s fs=%s free_bytes=%.0f total_bytes=%.0f\n", d, fs, $4 * 1024, $2 * 1024 }'
}

action=${1:-}
[ $# -gt 0 ] && shift
case $action in
    gpus) gpus ;;
    disk) disk "$@" ;;
    processes) processes "$@" ;;
    *) die_usage "usage: sh -s -- gpus | disk [--dir DIR] | processes --pattern ERE..." ;;
esac
