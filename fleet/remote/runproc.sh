#!/bin/sh
# fleet/remote/runproc.sh: the processes of one launched run, found by the secret FLEET_RUN_KEY
# that launch.sh puts in the run's environment (never an argv) and hands this script as RUNPROC_KEY:
# all its processes inherit it however they detach, a recycled pid never carries it, and only root
# and the owner read /proc/PID/environ, so no other user can pass for the run as FLEET_RUN_ID=ID
# would let them (a run from before keys, RUNPROC_KEY empty, is found by that). launch.sh runs this
# text on the node, or in the run's container, whose /proc shows the run:
#
#   probe ID RUN_DIR   wrapper=alive|gone launcher=alive|gone|none launcher_pid=P exit=N|none
#                      procs=N uptime_s=S, from what the wrapper wrote in RUN_DIR (launch.sh's
#                      WRAP); procs counts the run's other processes
#   kill ID GRACE      TERM each run process once (new ones as they come) for GRACE s, then KILL the
#                      rest; a line per process, `killed pid=P by TERM|KILL: CMDLINE`, then
#                      `killed=N term=N kill=N left=N`; exit 1 when one survives KILL
#   live               the run ids live processes carry, sorted, once each; only plain names
#                      (no `.`, `..`, path or glob): anyone can carry one (launch.sh asks `probe`)
# shellcheck disable=SC2034 # read by die_usage (lib.sh)
SCRIPT=runproc.sh
# fleet:source lib.sh

marked() { # ID: the pids of run ID (the key's, else the marker's), this shell aside
    if [ -n "${RUNPROC_KEY:-}" ]; then # awk reads the key from its environment, not its argv
        environ -F -e FLEET_RUN_KEY= | awk -v s="$SOH" '{ k = "FLEET_RUN_KEY=" ENVIRON["RUNPROC_KEY"] s }
            index($0, "/environ:" k) || index($0, s k) { sub("/.*", ""); print }'
    else
        environ -F -e "environ:FLEET_RUN_ID=$1$SOH" -e "${SOH}FLEET_RUN_ID=$1$SOH" | sed 's|/.*||'
    fi | uniq | grep -vxF -e "$$"
}
live() {
    environ -F -e FLEET_RUN_ID= | tr "$SOH" '\n' | sed -n -e 's|^[0-9]*/environ:||' -e 's/^FLEET_RUN_ID=//p' |
        grep -x -e '[A-Za-z0-9][A-Za-z0-9._+-]*' | sort -u
}
probe() {
    wp=$(cat "$2/pid" 2>/dev/null) lp=$(cat "$2/launcher" 2>/dev/null) code=$(cat "$2/exit" 2>/dev/null)
    case $lp in '' | *[!0-9]*) lp='' ;; esac
    case $code in '' | *[!0-9]*) code=none ;; esac
    w=gone l=${lp:+gone} n=0 UPTIME=0
    for p in $(marked "$1"); do
        if [ "$p" = "$wp" ]; then w=alive; elif [ "$p" = "$lp" ]; then l=alive; else n=$((n + 1)); fi
    done
    [ "$l" != alive ] || uptime_of "$lp"
    say "wrapper=$w launcher=${l:-none} launcher_pid=${lp:-none} exit=$code procs=$n uptime_s=$UPTIME"
}

remember() { # SIG PID...: keep each new pid's command line for the report (the process will be
    sig=$1 && shift # gone), and send it SIG (- none): a TERM once, never again every round. Every
    new=''         # line is read before any signal: a launcher on TERM ends its workers at once
    for p; do
        case $NL$cmds in *"$NL$p "*) continue ;; esac
        c=$(tr '\0\n\t' '   ' <"/proc/$p/cmdline" 2>/dev/null | cut -c1-200)
        cmds="$cmds$p ${c% }$NL" new="$new $p"
    done
    # shellcheck disable=SC2086 # pids are words
    [ "$sig" = - ] || [ -z "$new" ] || kill "-$sig" $new 2>/dev/null
}
kill_run() {
    id=$1 whole=${2%%.*} cmds='' i=0
    frac=${2#"$whole"}
    frac=${frac#.}0
    limit=$((${whole:-0} * 10 + ${frac%"${frac#?}"})) # tenths of a second, without awk
    # shellcheck disable=SC2046 # pids are words
    set -- $(marked "$id")
    while [ $# -gt 0 ] && [ "$i" -le "$limit" ]; do
        remember TERM "$@"
        sleep 0.1
        i=$((i + 1))
        # shellcheck disable=SC2046
        set -- $(marked "$id")
    done
    after_term=" $* " i=0
    [ $# -eq 0 ] || { remember - "$@" && kill -KILL "$@" 2>/dev/null; }
    while [ $# -gt 0 ] && [ "$i" -lt 50 ]; do
        sleep 0.1
        i=$((i + 1))
        # shellcheck disable=SC2046
        set -- $(marked "$id")
    done
    left=" $* " nterm=0 nkill=0
    while read -r p c; do
        [ -n "$p" ] || continue
        case $left in *" $p "*) say "left pid=$p: $c" && continue ;; esac
        case $after_term in *" $p "*) sig=KILL nkill=$((nkill + 1)) ;; *) sig=TERM nterm=$((nterm + 1)) ;; esac
        say "killed pid=$p by $sig: $c"
    done <<EOF
$cmds
EOF
    say "killed=$((nterm + nkill)) term=$nterm kill=$nkill left=$#"
    [ $# -eq 0 ]
}

case ${1:-}:$# in
    probe:3) probe "$2" "$3" ;;
    kill:3) kill_run "$2" "$3" ;;
    live:1) live ;;
    *) die_usage "usage: probe RUN_ID RUN_DIR | kill RUN_ID GRACE | live" ;;
esac
