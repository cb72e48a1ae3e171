#!/bin/sh
# fleet/remote/runproc.sh: the processes of one launched run, found by the marker every one of them
# carries in its environment, FLEET_RUN_ID=<run id>. launch.sh starts the run's wrapper with it, so
# the launcher, its workers and their DataLoader workers inherit it, however they detach: torchrun
# puts each worker in a session of its own, and a worker whose agent died (kill -9, OOM) is
# re-parented to init. A process group or a parent chain loses them; the marker does not, and a
# recycled pid never carries it.
#
# launch.sh runs this text on the node (sh -c), or inside the run's container (docker exec), where
# the container's own /proc is the one that shows the run:
#
#   probe RUN_ID RUN_DIR        facts, one line:
#       wrapper=alive|gone launcher=alive|gone|none launcher_pid=P exit=N|none procs=N uptime_s=S
#     (procs: the run's processes besides its wrapper and launcher: workers and theirs)
#   kill RUN_ID GRACE   TERM every process of the run, GRACE seconds (new ones, such as
#     workers a launcher restarts meanwhile, are signalled too), then KILL what is left. One line
#     per process (`killed pid=P by TERM|KILL: CMDLINE`), then `killed=N term=N kill=N left=N`.
#     Exit 1 when a process survives KILL.
#   live                the run ids that live processes carry (one per line, sorted, unique):
#     launch.sh refuses a start while any run of its state dir still has a process, whether or
#     not its `current` names it (a start that was cut short before it recorded the run).
#
# RUN_DIR holds what the wrapper wrote: pid (the wrapper), launcher (pid of the command),
# exit (the command's exit status, 128+N for signal N).

LC_ALL=C
export LC_ALL

ZGREP=0
printf 'a\0' | grep -qzx a 2>/dev/null && ZGREP=1

# The pids whose environment holds FLEET_RUN_ID=$1 exactly (zombies have none), this shell aside.
marked() {
    if [ "$ZGREP" = 1 ]; then
        grep -lzxF -e "FLEET_RUN_ID=$1" /proc/[0-9]*/environ 2>/dev/null
    else
        for f in /proc/[0-9]*/environ; do
            tr '\0' '\n' <"$f" 2>/dev/null | grep -qxF -e "FLEET_RUN_ID=$1" && printf '%s\n' "$f"
        done
    fi | sed -n 's|^/proc/\([0-9]*\)/environ$|\1|p' | grep -vxF -e "$$"
}

# Every run id that a live process carries (zombies have no environment).
live_ids() {
    if [ "$ZGREP" = 1 ]; then
        grep -ahz '^FLEET_RUN_ID=' /proc/[0-9]*/environ 2>/dev/null | tr '\0' '\n'
    else
        for f in /proc/[0-9]*/environ; do
            tr '\0' '\n' <"$f" 2>/dev/null | grep '^FLEET_RUN_ID='
        done
    fi | sed -n 's/^FLEET_RUN_ID=//p' | sort -u
}

read_pid() {
    # FILE: its first word, when it is a pid
    p=$(cat "$1" 2>/dev/null) || return 1
    case $p in '' | *[!0-9]*) return 1 ;; esac
    printf '%s\n' "$p"
}

start_ticks() {
    # PID: field 22 of /proc/PID/stat (start time in clock ticks), counted after comm's last ')'
    s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    # shellcheck disable=SC2086 # split into fields on purpose
    set -- ${s##*) }
    shift 19
    printf '%s\n' "$1"
}

probe() {
    id=$1 rdir=$2
    # shellcheck disable=SC2046 # pids are words
    set -- $(marked "$id")
    wrapper=$(read_pid "$rdir/pid") || wrapper=
    launcher=$(read_pid "$rdir/launcher") || launcher=
    w=gone l=none others=0 up=0
    [ -n "$launcher" ] && l=gone
    for p in "$@"; do
        if [ "$p" = "$wrapper" ]; then
            w=alive
        elif [ "$p" = "$launcher" ]; then
            l=alive
        else
            others=$((others + 1))
        fi
    done
    if [ "$l" = alive ] && ticks=$(start_ticks "$launcher"); then
        hz=$(getconf CLK_TCK 2>/dev/null || echo 100)
        now=$(cut -d' ' -f1 /proc/uptime)
        up=$((${now%.*} - ticks / hz))
    fi
    code=$(cat "$rdir/exit" 2>/dev/null) || code=
    case $code in '' | *[!0-9]*) code=none ;; esac
    printf 'wrapper=%s launcher=%s launcher_pid=%s exit=%s procs=%s uptime_s=%s\n' \
        "$w" "$l" "${launcher:-none}" "$code" "$others" "$up"
}

cmdline() {
    c=$(tr '\0\n\t' '   ' <"/proc/$1/cmdline" 2>/dev/null | cut -c1-200)
    printf '%s\n' "${c% }"
}

tenths() {
    # SECONDS as tenths of a second, without awk (a container may lack it): 2.5 -> 25
    whole=${1%%.*}
    frac=${1#"$whole"}
    frac=${frac#.}0
    echo $((${whole:-0} * 10 + ${frac%"${frac#?}"}))
}

kill_run() {
    id=$1
    limit=$(tenths "$2")
    cmds=''
    # note PID...: each new pid's command line, kept for the report (the process will be gone)
    note() {
        for p in "$@"; do
            case $cmds in "$p "* | *"
$p "*) continue ;; esac
            cmds="$cmds$p $(cmdline "$p")
"
        done
    }
    # shellcheck disable=SC2046 # pids are words
    set -- $(marked "$id")
    i=0
    while [ $# -gt 0 ] && [ "$i" -le "$limit" ]; do
        note "$@"
        kill -TERM "$@" 2>/dev/null
        sleep 0.1
        i=$((i + 1))
        # shellcheck disable=SC2046
        set -- $(marked "$id")
    done
    after_term=" $* "
    if [ $# -gt 0 ]; then
        note "$@"
        kill -KILL "$@" 2>/dev/null
        i=0
        while [ $# -gt 0 ] && [ "$i" -lt 50 ]; do
            sleep 0.1
            i=$((i + 1))
            # shellcheck disable=SC2046
            set -- $(marked "$id")
        done
    fi
    left=" $* "
    nterm=0
    nkill=0
    while read -r p c; do
        [ -n "$p" ] || continue
        case $left in *" $p "*) printf 'left pid=%s: %s\n' "$p" "$c"; continue ;; esac
        case $after_term in
            *" $p "*) sig=KILL nkill=$((nkill + 1)) ;;
            *) sig=TERM nterm=$((nterm + 1)) ;;
        esac
        printf 'killed pid=%s by %s: %s\n' "$p" "$sig" "$c"
    done <<EOF
$cmds
EOF
    printf 'killed=%s term=%s kill=%s left=%s\n' "$((nterm + nkill))" "$nterm" "$nkill" "$#"
    [ $# -eq 0 ]
}

case ${1:-} in
    probe) [ $# -eq 3 ] || exit 2; probe "$2" "$3" ;;
    kill) [ $# -eq 3 ] || exit 2; kill_run "$2" "$3" ;;
    live) [ $# -eq 1 ] || exit 2; live_ids ;;
    *) printf 'runproc.sh: usage: probe RUN_ID RUN_DIR | kill RUN_ID GRACE | live\n' >&2; exit 2 ;;
esac
