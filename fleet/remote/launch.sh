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
# Each run gets DIR/ID/ with: cmd (one word per line), env-keys (never the values), log, and what
# the run's wrapper writes: pid (the wrapper), launcher (the command's pid), exit (its status);
# `stopped` once fleet stopped it; for a run inside a container, `container` and `inner-dir` (the
# wrapper's files and the log are there, in the container). DIR/current names the newest run.
# A run is started with setsid and all three streams redirected, so it survives the SSH session
# and the session does not hang on it (PITFALLS 12). Every process of the run carries
# FLEET_RUN_ID=<id> in its environment: stop and status find the run's processes by that marker
# (runproc.sh), including workers that left its session or were re-parented to init when their
# launcher died. Environment variables are passed on the command line because sshd drops the
# client's (PITFALLS 13).
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

# fleet:include runproc.sh as RUNPROC

# The run's wrapper: sh -c "$WRAP" fleet-run RUN_DIR CMD... It records its pid, starts the command
# in the foreground (a shell that first records its own pid, then execs it, so `launcher` is the
# command's pid) and, when the command ends, its exit status (128+N for signal N). A TERM or HUP
# to the wrapper waits for the command instead of abandoning the record; the command itself gets
# default dispositions (a trapped signal is reset on exec, an ignored one would not be).
# shellcheck disable=SC2016 # expanded by the wrapper, not here
WRAP='rdir=$1; shift
trap ": term" TERM
trap ": hup" HUP
echo $$ >"$rdir/pid"
sh -c '\''echo $$ >"$0"; exec "$@"'\'' "$rdir/launcher" "$@"
rc=$?
echo "$rc" >"$rdir/exit.tmp" && mv -f "$rdir/exit.tmp" "$rdir/exit"'

runproc() {
    # ACTION ARGS... for run $RDIR_ID: on the node, or inside the run's container
    if [ -n "$RUN_CONTAINER" ]; then
        docker exec "$RUN_CONTAINER" sh -c "$RUNPROC" runproc "$@"
    else
        sh -c "$RUNPROC" runproc "$@"
    fi
}

# Select the run in DIR: $1 = run id or "" for the current one. Sets RDIR (the host-side record),
# RDIR_ID, RUN_CONTAINER and INNER (where the wrapper writes: RDIR, or a dir in the container).
select_run() {
    if [ -n "$1" ]; then
        RDIR_ID=$1
    elif [ -s "$STATE_DIR/current" ]; then
        RDIR_ID=$(cat "$STATE_DIR/current")
    else
        return 1
    fi
    RDIR=$STATE_DIR/$RDIR_ID
    [ -d "$RDIR" ] || return 1
    RUN_CONTAINER=$(cat "$RDIR/container" 2>/dev/null) || RUN_CONTAINER=
    INNER=$RDIR
    [ -z "$RUN_CONTAINER" ] || INNER=$(cat "$RDIR/inner-dir" 2>/dev/null) || INNER=
}

# Facts of the selected run as words (see runproc.sh probe); "container=gone" when the run's
# container does not answer.
run_facts() {
    if ! facts=$(runproc probe "$RDIR_ID" "$INNER" 2>/dev/null); then
        facts="wrapper=gone launcher=gone launcher_pid=none exit=none procs=0 uptime_s=0 container=gone"
    fi
    printf '%s\n' "$facts"
}

# Does the selected run still have a live process (launcher, or any worker it left behind)?
run_busy() {
    f=$(run_facts)
    case $f in *"launcher=alive"* | *"wrapper=alive"*) return 0 ;; esac
    case $f in *" procs=0 "*) return 1 ;; esac
    return 0
}

launcher_alive() {
    case $(run_facts) in *"launcher=alive"*) return 0 ;; esac
    return 1
}

action_start() {
    mkdir -p "$STATE_DIR" || { say "start: cannot create $STATE_DIR"; exit 1; }
    if select_run "" && run_busy; then
        say "start: refused: run $RDIR_ID is still running ($(run_facts)); stop it first (fleet stop)"
        exit 1
    fi
    RDIR=$STATE_DIR/$RUN_ID
    RDIR_ID=$RUN_ID
    if [ -e "$RDIR" ]; then
        say "start: refused: run id $RUN_ID was already used on this node"
        exit 1
    fi
    if ! mkdir -p "$RDIR" || ! chmod 700 "$RDIR"; then
        say "start: cannot create $RDIR"
        exit 1
    fi
    : > "$RDIR/log"
    # Record the command (one word per line) and the env keys; never the env values.
    for word in "$@"; do printf '%s\n' "$word"; done > "$RDIR/cmd"
    for kv in $ENV_PAIRS_KEYS; do printf '%s\n' "$kv"; done > "$RDIR/env-keys"
    if [ -n "$WORKDIR" ] && [ -z "$CONTAINER" ] && ! cd "$WORKDIR" 2>/dev/null; then
        say "start: workdir $WORKDIR does not exist on this node"
        exit 1
    fi
    # The job's environment: --env pairs, then the run's marker (last, so it cannot be overridden).
    # shellcheck disable=SC2086
    eval "set -- $ENV_ARGS \"FLEET_RUN_ID=\$RUN_ID\" \"\$@\""
    if [ -n "$CONTAINER" ]; then
        start_in_container "$@"
    else
        start_on_host "$@"
    fi
    # Current from here on, even if it fails at once: status shows that failure and its log.
    printf '%s\n' "$RUN_ID" > "$STATE_DIR/current"
    wait_started
}

start_on_host() {
    RUN_CONTAINER=''
    INNER=$RDIR
    # setsid: new session and process group, detached from this SSH session (PITFALLS 12). The
    # wrapper itself carries the marker too, so a stop finds it with the rest.
    setsid env "FLEET_RUN_ID=$RUN_ID" sh -c "$WRAP" fleet-run "$RDIR" env "$@" \
        </dev/null >>"$RDIR/log" 2>&1 &
}

start_in_container() {
    RUN_CONTAINER=$CONTAINER INNER=/tmp/fleet-launch/$RUN_ID
    printf '%s\n' "$CONTAINER" > "$RDIR/container"
    printf '%s\n' "$INNER" > "$RDIR/inner-dir"
    # shellcheck disable=SC2016 # expanded by the shell inside the container
    set -- docker exec -d ${WORKDIR:+-w "$WORKDIR"} -e "FLEET_RUN_ID=$RUN_ID" "$CONTAINER" \
        sh -c 'd=$1 w=$2; shift 2; mkdir -p "$d" && exec sh -c "$w" fleet-run "$d" env "$@" >>"$d/log" 2>&1' \
        fleet-start "$INNER" "$WRAP" "$@"
    if ! out=$("$@" 2>&1); then
        say "$out"
        say "start: docker exec -d into $CONTAINER failed"
        exit 1
    fi
}

wait_started() {
    # The launcher's pid, then a short settle: a command that dies at once (not found, bad
    # arguments) is a failed start, not a launch.
    i=0
    while [ $i -lt 50 ]; do
        case $(runproc probe "$RUN_ID" "$INNER" 2>/dev/null) in
            *"launcher=none"*) ;;
            *) break ;;
        esac
        sleep 0.1
        i=$((i + 1))
    done
    i=0
    while [ $i -lt "$SETTLE_DS" ] && launcher_alive; do
        sleep 0.1
        i=$((i + 1))
    done
    if ! launcher_alive; then
        show_log_tail 5
        say "start: the run exited at once ($(run_facts); see $(log_path))"
        exit 1
    fi
    pid=$(run_facts | sed -n 's/.* launcher_pid=\([0-9]*\) .*/\1/p')
    say "started run=$RUN_ID pid=$pid${RUN_CONTAINER:+ container=$RUN_CONTAINER} log=$(log_path)"
}

log_path() {
    if [ -n "$RUN_CONTAINER" ]; then printf '%s\n' "$INNER/log"; else printf '%s\n' "$RDIR/log"; fi
}

show_log_tail() {
    # The last N lines of the run's log, each prefixed "log: " and cut to 300 characters.
    if [ -n "$RUN_CONTAINER" ]; then
        docker exec "$RUN_CONTAINER" tail -n "$1" "$INNER/log" 2>/dev/null
    else
        tail -n "$1" "$RDIR/log" 2>/dev/null
    fi | cut -c1-300 | sed 's/^/log: /'
}

action_stop() {
    select_run "$RUN_ID" || { say "stop: no run on this node"; exit 0; }
    if ! run_busy; then
        say "stop: run $RDIR_ID is not running: nothing to stop ($(run_facts))"
        exit 0
    fi
    : > "$RDIR/stopped"
    runproc kill "$RDIR_ID" "$GRACE"
    rc=$?
    if [ "$rc" -ne 0 ] || run_busy; then
        say "stop: run $RDIR_ID still has processes after KILL ($(run_facts))"
        exit 1
    fi
    say "stopped run=$RDIR_ID: none of its processes is left"
}

action_status() {
    select_run "" || { say "run=none"; exit 0; }
    facts=$(run_facts)
    case $facts in *"launcher=alive"*) ;; *) show_log_tail 5 ;; esac
    stopped=0
    [ -e "$RDIR/stopped" ] && stopped=1
    say "run=$RDIR_ID $facts stopped=$stopped${RUN_CONTAINER:+ container=$RUN_CONTAINER} log=$(log_path)"
}

action_logs() {
    select_run "$RUN_ID" || { say "logs: no run on this node"; exit 1; }
    follow=
    [ "$FOLLOW" = 1 ] && follow=-F
    if [ -n "$RUN_CONTAINER" ]; then
        # shellcheck disable=SC2086
        exec docker exec "$RUN_CONTAINER" tail -n "$LINES" $follow "$INNER/log"
    fi
    [ -e "$RDIR/log" ] || { say "logs: $RDIR/log not found"; exit 1; }
    # shellcheck disable=SC2086
    exec tail -n "$LINES" $follow "$RDIR/log"
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
GRACE=30
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
            GRACE=$2
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
