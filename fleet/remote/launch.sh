#!/bin/sh
# fleet/remote/launch.sh: start, stop, inspect and tail a detached training run on this node.
#
# fleet feeds this script on stdin:  sh -s -- ACTION [OPTIONS] < launch.sh
#
#   start  --run-id ID --state-dir DIR [--container C] [--workdir W] [--env K=V ...] -- CMD ARG...
#   stop   --state-dir DIR [--run-id ID] [--grace SECONDS]
#   status --state-dir DIR
#   logs   --state-dir DIR [--run-id ID] [--lines N] [--follow]
#
# Each run gets DIR/ID/ with: pid, starttime (pid identity: a recycled pid is never signalled),
# cmd, env keys, log, container (when it runs inside one). DIR/current names the newest run.
# A run is started with setsid and all three streams redirected, so it survives the SSH session
# and the session does not hang on it (PITFALLS 12); it leads its own process group, so stop can
# signal the whole group (workers included). Environment variables are passed on the command line
# because sshd drops the client's (PITFALLS 13).
#
# Exit: 0 ok, 1 refused or failed (reason on the last line), 2 bad usage.

LC_ALL=C
export LC_ALL

say() { printf '%s\n' "$*"; }
die_usage() { printf 'launch.sh: %s\n' "$*" >&2; exit 2; }

# shellcheck disable=SC2088 # a literal "~/" prefix, expanded here on purpose
expand_home() {
    case $1 in
        "~") printf '%s\n' "$HOME" ;;
        "~/"*) printf '%s/%s\n' "$HOME" "${1#"~/"}" ;;
        *) printf '%s\n' "$1" ;;
    esac
}

# Field 22 of /proc/PID/stat (start time in clock ticks), parsed after the last ')' of comm.
start_time() {
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    rest=${stat##*) }
    # shellcheck disable=SC2086
    set -- $rest
    shift 19
    printf '%s\n' "$1"
}

# Is the run's recorded pid alive and still the process we started (same start time)?
run_alive() {
    rdir=$1
    [ -s "$rdir/pid" ] || return 1
    pid=$(cat "$rdir/pid")
    if [ -s "$rdir/container" ]; then
        docker exec "$(cat "$rdir/container")" kill -0 "$pid" 2>/dev/null
        return
    fi
    now=$(start_time "$pid") || return 1
    state=$(sed -n 's/^State:[[:space:]]*\([A-Z]\).*/\1/p' "/proc/$pid/status" 2>/dev/null)
    [ "$state" != Z ] || return 1
    [ ! -s "$rdir/starttime" ] || [ "$now" = "$(cat "$rdir/starttime")" ]
}

uptime_of() {
    pid=$1
    ticks=$(getconf CLK_TCK 2>/dev/null || echo 100)
    st=$(start_time "$pid") || { echo 0; return; }
    up=$(cut -d' ' -f1 /proc/uptime)
    up=${up%.*}
    echo $((up - st / ticks))
}

resolve_run() {
    # DIR [ID] -> prints the run dir, or fails
    if [ -n "$2" ]; then
        printf '%s/%s\n' "$1" "$2"
    elif [ -s "$1/current" ]; then
        printf '%s/%s\n' "$1" "$(cat "$1/current")"
    else
        return 1
    fi
}

action_start() {
    mkdir -p "$STATE_DIR" || { say "start: cannot create $STATE_DIR"; exit 1; }
    if [ -s "$STATE_DIR/current" ]; then
        cur=$(cat "$STATE_DIR/current")
        if run_alive "$STATE_DIR/$cur"; then
            say "start: refused: run $cur is still running (pid $(cat "$STATE_DIR/$cur/pid")); stop it first (fleet stop)"
            exit 1
        fi
    fi
    rdir=$STATE_DIR/$RUN_ID
    if [ -e "$rdir" ]; then
        say "start: refused: run id $RUN_ID was already used on this node"
        exit 1
    fi
    if ! mkdir -p "$rdir" || ! chmod 700 "$rdir"; then
        say "start: cannot create $rdir"
        exit 1
    fi
    log=$rdir/log
    : > "$log"
    # Record the command (quoted, one word per line) and the env keys; never the env values.
    for word in "$@"; do printf '%s\n' "$word"; done > "$rdir/cmd"
    for kv in $ENV_PAIRS_KEYS; do printf '%s\n' "$kv"; done > "$rdir/env-keys"
    if [ -n "$WORKDIR" ] && [ -z "$CONTAINER" ] && ! cd "$WORKDIR" 2>/dev/null; then
        say "start: workdir $WORKDIR does not exist on this node"
        exit 1
    fi
    if [ -n "$CONTAINER" ]; then
        start_in_container "$rdir" "$@"
    else
        start_on_host "$rdir" "$@"
    fi
}

start_on_host() {
    rdir=$1
    shift
    # setsid: new session and process group (pgid = pid), detached from this SSH session.
    # shellcheck disable=SC2086
    eval "set -- $ENV_ARGS \"\$@\""
    # shellcheck disable=SC2016 # expanded by the detached shell, not this one
    setsid sh -c 'echo $$ > "$1"; shift; exec env "$@"' fleet-launch "$rdir/pid" "$@" \
        </dev/null >>"$rdir/log" 2>&1 &
    wait_started "$rdir"
}

start_in_container() {
    rdir=$1
    shift
    printf '%s\n' "$CONTAINER" > "$rdir/container"
    inner_pid=/tmp/fleet-launch-$RUN_ID.pid
    inner_log=/tmp/fleet-launch-$RUN_ID.log
    # shellcheck disable=SC2086
    eval "set -- $ENV_ARGS \"\$@\""
    # shellcheck disable=SC2016 # expanded by the shell inside the container
    set -- docker exec -d ${WORKDIR:+-w "$WORKDIR"} "$CONTAINER" sh -c \
        'echo $$ > "$1"; log=$2; shift 2; exec env "$@" >>"$log" 2>&1' fleet-launch \
        "$inner_pid" "$inner_log" "$@"
    if ! out=$("$@" 2>&1); then
        say "$out"
        say "start: docker exec -d into $CONTAINER failed"
        exit 1
    fi
    printf '%s\n' "$inner_log" > "$rdir/log-in-container"
    i=0
    while [ $i -lt 50 ]; do
        pid=$(docker exec "$CONTAINER" cat "$inner_pid" 2>/dev/null) && [ -n "$pid" ] && break
        sleep 0.1
        i=$((i + 1))
    done
    if [ -z "${pid:-}" ]; then
        say "start: the run did not start inside $CONTAINER"
        exit 1
    fi
    printf '%s\n' "$pid" > "$rdir/pid"
    printf '%s\n' "$RUN_ID" > "$STATE_DIR/current"
    say "started run=$RUN_ID pid=$pid container=$CONTAINER log=$inner_log"
}

wait_started() {
    rdir=$1
    i=0
    while [ ! -s "$rdir/pid" ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
    if [ ! -s "$rdir/pid" ]; then
        say "start: the run did not start"
        exit 1
    fi
    pid=$(cat "$rdir/pid")
    start_time "$pid" > "$rdir/starttime" 2>/dev/null
    # A command that dies at once (not found, bad arguments) is a failed start, not a launch.
    i=0
    while [ $i -lt "$SETTLE_DS" ]; do
        run_alive "$rdir" || break
        sleep 0.1
        i=$((i + 1))
    done
    if ! run_alive "$rdir"; then
        tail -n 5 "$rdir/log" 2>/dev/null
        say "start: the run exited at once (see $rdir/log)"
        exit 1
    fi
    printf '%s\n' "$RUN_ID" > "$STATE_DIR/current"
    say "started run=$RUN_ID pid=$pid log=$rdir/log"
}

action_stop() {
    rdir=$(resolve_run "$STATE_DIR" "$RUN_ID") || { say "stop: no run on this node"; exit 0; }
    id=${rdir##*/}
    if ! run_alive "$rdir"; then
        say "stop: run $id is not running"
        exit 0
    fi
    pid=$(cat "$rdir/pid")
    if [ -s "$rdir/container" ]; then
        c=$(cat "$rdir/container")
        docker exec "$c" sh -c 'kill -TERM -"$1" 2>/dev/null || kill -TERM "$1"' sh "$pid"
    else
        kill -TERM -"$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null
    fi
    i=0
    limit=$((GRACE_DS))
    while run_alive "$rdir" && [ $i -lt "$limit" ]; do sleep 0.1; i=$((i + 1)); done
    how=TERM
    if run_alive "$rdir"; then
        how=KILL
        if [ -s "$rdir/container" ]; then
            docker exec "$c" sh -c 'kill -KILL -"$1" 2>/dev/null || kill -KILL "$1"' sh "$pid"
        else
            kill -KILL -"$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null
        fi
        i=0
        while run_alive "$rdir" && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
    fi
    if run_alive "$rdir"; then
        say "stop: run $id still running (pid $pid) after KILL"
        exit 1
    fi
    say "stopped run=$id pid=$pid ($how)"
}

action_status() {
    rdir=$(resolve_run "$STATE_DIR" "") || { say "run=none"; exit 0; }
    id=${rdir##*/}
    pid=$(cat "$rdir/pid" 2>/dev/null)
    if run_alive "$rdir"; then
        up=0
        [ -s "$rdir/container" ] || up=$(uptime_of "$pid")
        say "run=$id state=running pid=$pid uptime_s=$up log=$rdir/log"
    else
        say "run=$id state=exited pid=${pid:-none} log=$rdir/log"
    fi
}

action_logs() {
    rdir=$(resolve_run "$STATE_DIR" "$RUN_ID") || { say "logs: no run on this node"; exit 1; }
    follow=
    [ "$FOLLOW" = 1 ] && follow=-F
    if [ -s "$rdir/container" ]; then
        # shellcheck disable=SC2086
        exec docker exec "$(cat "$rdir/container")" tail -n "$LINES" $follow "$(cat "$rdir/log-in-container")"
    fi
    [ -e "$rdir/log" ] || { say "logs: $rdir/log not found"; exit 1; }
    # shellcheck disable=SC2086
    exec tail -n "$LINES" $follow "$rdir/log"
}

ACTION=${1:-}
[ -n "$ACTION" ] || die_usage "missing ACTION (start, stop, status, logs)"
shift
RUN_ID=
STATE_DIR=
CONTAINER=
WORKDIR=
ENV_ARGS=
ENV_PAIRS_KEYS=
GRACE_DS=300
LINES=20
FOLLOW=0
SETTLE_DS=${FLEET_LAUNCH_SETTLE_DS:-10}
n=0
while [ $# -gt 0 ]; do
    case $1 in
        --run-id) [ $# -ge 2 ] || die_usage "--run-id needs a value"; RUN_ID=$2; shift 2 ;;
        --state-dir) [ $# -ge 2 ] || die_usage "--state-dir needs a value"; STATE_DIR=$(expand_home "$2"); shift 2 ;;
        --container) [ $# -ge 2 ] || die_usage "--container needs a value"; CONTAINER=$2; shift 2 ;;
        --workdir) [ $# -ge 2 ] || die_usage "--workdir needs a value"; WORKDIR=$(expand_home "$2"); shift 2 ;;
        --env)
            [ $# -ge 2 ] || die_usage "--env needs K=V"
            case $2 in
                [A-Za-z_]*=*) ;;
                *) die_usage "--env '$2': expected NAME=VALUE" ;;
            esac
            # Keep each pair as its own positional word later on: store as numbered variables.
            n=$((n + 1))
            eval "ENV_$n=\$2"
            ENV_ARGS="$ENV_ARGS \"\$ENV_$n\""
            ENV_PAIRS_KEYS="$ENV_PAIRS_KEYS ${2%%=*}"
            shift 2
            ;;
        --grace)
            [ $# -ge 2 ] || die_usage "--grace needs seconds"
            case $2 in *[!0-9.]* | "") die_usage "--grace '$2' is not a number" ;; esac
            GRACE_DS=$(awk -v s="$2" 'BEGIN { printf "%d", s * 10 }')
            shift 2
            ;;
        --lines)
            [ $# -ge 2 ] || die_usage "--lines needs a number"
            case $2 in *[!0-9]* | "") die_usage "--lines '$2' is not a number" ;; esac
            LINES=$2
            shift 2
            ;;
        --follow) FOLLOW=1; shift ;;
        --) shift; break ;;
        *) die_usage "unknown option '$1'" ;;
    esac
done
[ -n "$STATE_DIR" ] || die_usage "--state-dir is required"

case $ACTION in
    start)
        [ -n "$RUN_ID" ] || die_usage "start needs --run-id"
        case $RUN_ID in */* | .* | "") die_usage "bad run id '$RUN_ID'" ;; esac
        [ $# -gt 0 ] || die_usage "start needs a command after --"
        action_start "$@"
        ;;
    stop) action_stop ;;
    status) action_status ;;
    logs) action_logs ;;
    *) die_usage "unknown action '$ACTION' (start, stop, status, logs)" ;;
esac
