#!/bin/sh
# fleet/remote/act.sh: do exactly what fleet decided from facts.sh's report, in the order given,
# and say what became of each item, a line each (the format: fleet/node/act.py). Exit 2, acting on
# nothing, on bad usage.
#
#   sh -s -- [signal GRACE_DS PID:START...] [remove TYPE PATH REAL...] [gpu-reset] [facts ARGS...]
#   (fleet puts them first on stdin as a `set --` line: lists of any length; fleet/node/commands.py)
#
# signal: TERM and CONT (a stopped process sees the TERM) to each process still alive with that
#   start time (a recycled pid is never signalled), GRACE_DS deciseconds for them to end, KILL to
#   the rest, 5 s for that. Under a node-wide flock (in fleet's node state: lib.sh's node_state):
#   of two cleanups at once only one claims a kill.
# remove: each PATH still of TYPE (d f l o) whose physical path is still REAL, by rm -rf (which
#   follows no symlink); PATH and REAL in printf %b escapes. TYPE in capitals: held only by the
#   processes signalled here, so removed only once all of them ended.
# facts ARGS...: last; after `done`, facts.sh's report for ARGS in the same SSH channel.
# shellcheck disable=SC2034 # read by die_usage (lib.sh)
SCRIPT=act.sh
# fleet:source lib.sh
# fleet:include facts.sh as FACTS_SH
# the node-wide lock, in fleet's own node state (lib.sh's node_state), never in a shared /tmp
LOCK=''

# await_gone PIDS DECISECONDS: ALIVE = those of PIDS still alive once all ended or the time is up.
# Most end within milliseconds of TERM: the first polls come fast, then every 0.2 s.
await_gone() {
    wg_cs=0
    while :; do
        ALIVE=
        for wg_p in $1; do eval "proc_is $wg_p \$S_$wg_p" && ALIVE="$ALIVE $wg_p "; done
        [ -n "$ALIVE" ] && [ "$wg_cs" -lt $(($2 * 10)) ] || return 0
        wg_step=20
        for wg_at in 2 5 10; do [ "$wg_at" -le "$wg_cs" ] || { wg_step=$((wg_at - wg_cs)) && break; }; done
        [ $((wg_cs + wg_step)) -le $(($2 * 10)) ] || wg_step=$(($2 * 10 - wg_cs)) # never past the time
        sleep "0.$((wg_step / 10))$((wg_step % 10))"
        wg_cs=$((wg_cs + wg_step))
    done
}

signal() {
    sg_sent='' sg_denied='' LOCKED=''
    if { command -v flock && node_state && LOCK=$NODE_STATE/cleanup.lock && command exec 8>>"$LOCK"; } >/dev/null 2>&1; then
        LOCKED=1
        flock -n 8 || { say "lock wait" && flock -w $(($1 / 10 + 30)) 8; } || say "lock late"
    else
        say "lock none"
    fi
    for sg_p in $2; do
        eval "S_${sg_p%:*}=${sg_p#*:}"
        sg_p=${sg_p%:*}
        if ! eval "proc_is $sg_p \$S_$sg_p"; then
            say "signal $sg_p gone"
        elif kill -s TERM "$sg_p" 2>/dev/null; then
            kill -s CONT "$sg_p" 2>/dev/null
            sg_sent="$sg_sent $sg_p"
        elif eval "proc_is $sg_p \$S_$sg_p"; then
            sg_denied="$sg_denied $sg_p"
        else
            say "signal $sg_p gone"
        fi
    done
    await_gone "$sg_sent" "$1"
    sg_killed=''
    for sg_p in $sg_sent; do
        case $ALIVE in *" $sg_p "*) ;; *) say "signal $sg_p term" && continue ;; esac
        if kill -s KILL "$sg_p" 2>/dev/null; then
            sg_killed="$sg_killed $sg_p"
        elif eval "proc_is $sg_p \$S_$sg_p"; then
            sg_denied="$sg_denied $sg_p"
        else
            say "signal $sg_p term"
        fi
    done
    await_gone "$sg_killed" 50
    for sg_p in $sg_killed; do
        case $ALIVE in *" $sg_p "*) say "signal $sg_p left" ;; *) say "signal $sg_p kill" ;; esac
    done
    for sg_p in $sg_denied; do say "signal $sg_p denied"; done
    SURVIVED=$ALIVE$sg_denied
    [ -z "$LOCKED" ] || exec 8>&-
}
# remove N TYPE PATH REAL
remove() {
    case $2 in [DFLO]) [ -z "${SURVIVED# }" ] || { say "remove $1 held" && return; } ;; esac
    rm_p=$(printf '%bx' "$3")
    rm_p=${rm_p%x}
    rm_r=$(printf '%bx' "$4")
    rm_r=${rm_r%x}
    ftype "$rm_p"
    real_path "$rm_p"
    if [ "$FTYPE" = - ]; then
        say "remove $1 gone"
    elif [ "$FTYPE" != "$(printf '%s' "$2" | tr DFLO dflo)" ] || [ "$REAL" != "$rm_r" ]; then
        say "remove $1 changed"
    elif rm_e=$(rm -rf -- "$rm_p" 2>&1) && ! { [ -e "$rm_p" ] || [ -L "$rm_p" ]; }; then
        say "remove $1 removed"
    else
        to_hex <<EOF
${rm_e:-still there}
EOF
        say "remove $1 failed $HEX"
    fi
}

gpu_reset() {
    gr_out=$(timeout 120 nvidia-smi --gpu-reset 2>&1)
    gr_rc=$?
    to_hex <<EOF
$gr_out
EOF
    say "gpu-reset $gr_rc $(printf '%.8000s' "$HEX")"
}
# run check|act ARGS...: walk the arguments; `check` only validates them.
run() {
    ru_do=$1 ru_n=0
    shift
    while [ "$#" -gt 0 ]; do
        case $1 in
        signal)
            case ${2-} in '' | *[!0-9]*) die_usage "signal needs deciseconds" ;; esac
            ru_grace=$2 ru_items=''
            shift 2
            while [ "$#" -gt 0 ]; do
                case $1 in [0-9]*:[0-9]*) ;; *) break ;; esac
                case $1 in *[!0-9:]* | *:*:*) die_usage "bad PID:START: $1" ;; esac
                ru_items="$ru_items $1"
                shift
            done
            [ "$ru_do" = check ] || signal "$ru_grace" "$ru_items"
            ;;
        remove)
            shift
            while [ "$#" -ge 3 ]; do
                case $1 in [dflo] | [DFLO]) ;; *) break ;; esac
                [ "$ru_do" = check ] || remove "$ru_n" "$1" "$2" "$3"
                ru_n=$((ru_n + 1))
                shift 3
            done
            ;;
        gpu-reset)
            [ "$ru_do" = check ] || gpu_reset
            shift
            ;;
        facts)
            [ "$ru_do" = check ] && return 0
            say 'done'
            shift
            printf '%s\n' "$FACTS_SH" | sh -s -- "$@"
            exit
            ;;
        *) die_usage "unknown action or item: $1" ;;
        esac
    done
}

perform() {
    exec </dev/null # the script itself arrives on stdin: keep children off it
    run check "$@"
    run act "$@"
    say 'done'
}

perform "$@"
