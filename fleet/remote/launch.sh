#!/bin/sh
# fleet/remote/launch.sh: start, stop, inspect and tail a detached training run on this node.
#
#   sh -s -- start  --run-id ID [--state-dir DIR] [--container C] [--workdir W] [--env K=V]... -- CMD...
#   sh -s -- stop   [--state-dir DIR] [--run-id ID] [--grace S]
#   sh -s -- status [--state-dir DIR]
#   sh -s -- logs   [--state-dir DIR] [--run-id ID] [--lines N] [--follow]
#
# DIR defaults to NODE_STATE/launch (lib.sh's node_state: /var/lib/fleet for root, a directory per
# node for another login); a DIR given must be the login's own, never writable by others.
# DIR/ID/ holds a run's cmd (a word a line), env-keys (never values), log, what its wrapper writes
# (WRAP), `stopped` once fleet stopped it, `aborted` when its start was rolled back and, in a
# container, `container` and `inner-dir` (where the wrapper's files and the log are). DIR/current
# names the newest run whose start completed. Run ids are plain names, never `current`; DIR's own
# files start with '.'. start and stop take turns under DIR/.lock (lib.sh's lock_take).
# The run starts under setsid with its streams redirected (it outlives the SSH session, PITFALLS
# 12), its --env pairs in its environment, never on a command line (with_env), and, last, the
# marker FLEET_RUN_ID=ID that all its processes inherit, with the run's secret FLEET_RUN_KEY (DIR/
# ID/key, root's; in the environment only): runproc.sh finds and stops them by the key.
# Exit: 0 ok, 1 refused or failed (reason on the last line), 2 bad usage.
# shellcheck disable=SC2034 # read by die_usage (lib.sh)
SCRIPT=launch.sh
# fleet:source lib.sh
# fleet:include runproc.sh as RUNPROC
LOCK_WAIT_S=15

# The run's wrapper: sh -c "$WRAP" fleet-run RUN_DIR CMD... records its pid, runs the command (a
# shell that records its own pid as `launcher`, then execs it) and its exit status, each file
# written aside and renamed. TERM or HUP to the wrapper waits for the command; the command gets
# default dispositions (a trapped signal is reset on exec, an ignored one would not be).
# shellcheck disable=SC2016 # expanded by the wrapper
WRAP='rdir=$1; shift
trap ": term" TERM
trap ": hup" HUP
echo $$ >"$rdir/pid.tmp" && mv -f "$rdir/pid.tmp" "$rdir/pid"
sh -c '\''echo $$ >"$0.tmp" && mv -f "$0.tmp" "$0"; exec "$@"'\'' "$rdir/launcher" "$@"
rc=$?
echo "$rc" >"$rdir/exit.tmp" && mv -f "$rdir/exit.tmp" "$rdir/exit"'

# with_env N PAIR...: (in a subshell) export the pairs, then marker and key (never overridden);
# ENV_NAMES = their names. Values only in the environment: every user reads every argv (`ps`).
with_env() {
    we_n=$1 ENV_NAMES=''
    shift
    # shellcheck disable=SC2163 # NAME=VALUE: export takes the assignment
    while [ "$we_n" -gt 0 ]; do export "$1" && ENV_NAMES="$ENV_NAMES ${1%%=*}" && shift && we_n=$((we_n - 1)) || return 1; done
    export "FLEET_RUN_ID=$RUN_ID" "FLEET_RUN_KEY=$RUN_KEY"
}
# in_container CMD...: CMD under the wrapper in the container, files in a new 0700 INNER, each
# --env pair and the marker passed by name (docker reads the values from its environment).
in_container() {
    # shellcheck disable=SC2016 # expanded by the shell in the container
    set -- ${WORKDIR:+-w "$WORKDIR"} "$CONTAINER" sh -c \
        'd=$1 w=$2; shift 2; mkdir -m 700 "$d" && exec sh -c "$w" fleet-run "$d" env "$@" >>"$d/log" 2>&1' \
        fleet-start "$INNER" "$WRAP" "$@"
    for name in $ENV_NAMES FLEET_RUN_ID FLEET_RUN_KEY; do set -- -e "$name" "$@"; done
    docker exec -d "$@"
}
in_run() { if [ -n "$RUN_CONTAINER" ]; then docker exec "$RUN_CONTAINER" "$@"; else "$@"; fi }
runproc() { # the selected run's key goes in runproc.sh's environment (docker exec -e NAME: too)
    if [ -n "$RUN_CONTAINER" ]; then
        RUNPROC_KEY=$RUN_KEY docker exec -e RUNPROC_KEY "$RUN_CONTAINER" sh -c "$RUNPROC" runproc "$@"
    else RUNPROC_KEY=$RUN_KEY sh -c "$RUNPROC" runproc "$@"; fi
}
# held ID: HELD = runproc.sh's probe of run ID on this node, by its key; true while it has a process.
held() {
    HELD=$(RUNPROC_KEY=$(cat "$STATE_DIR/$1/key" 2>/dev/null) sh -c "$RUNPROC" runproc probe "$1" "$STATE_DIR/$1")
    case $HELD in *=alive* | *" procs="[1-9]*) ;; *) false ;; esac
}

# select_run ID: the run ID, or the current one for "": RDIR, RDIR_ID, RUN_CONTAINER and INNER
# (where its wrapper writes: RDIR, or a directory in the container).
select_run() {
    RDIR_ID=${1:-$(cat "$STATE_DIR/current" 2>/dev/null)}
    RDIR=$STATE_DIR/$RDIR_ID INNER=$STATE_DIR/$RDIR_ID
    [ -n "$RDIR_ID" ] && [ -d "$RDIR" ] || return 1
    RUN_KEY=$(cat "$RDIR/key" 2>/dev/null) || RUN_KEY=''
    RUN_CONTAINER=$(cat "$RDIR/container" 2>/dev/null) || RUN_CONTAINER=''
    [ -z "$RUN_CONTAINER" ] || INNER=$(cat "$RDIR/inner-dir" 2>/dev/null) || INNER=''
}
# facts: FACTS = runproc.sh's probe of the selected run; container=gone when its container is.
facts() {
    FACTS=$(runproc probe "$RDIR_ID" "$INNER" 2>/dev/null) ||
        FACTS="wrapper=gone launcher=gone launcher_pid=none exit=none procs=0 uptime_s=0 container=gone"
}
busy() { facts && case $FACTS in *=alive*) ;; *" procs=0 "*) false ;; esac }
launched() { facts && case $FACTS in *launcher=none*) false ;; esac }
launcher_gone() { facts && case $FACTS in *launcher=alive*) false ;; esac }
tail_log() { in_run tail -n "$1" "$INNER/log" 2>/dev/null | cut -c1-300 | sed 's/^/log: /'; }

# start_run: one transaction under DIR's lock: refuse while any run of DIR has a live process,
# start, wait for the launcher, then name the run in DIR/current. TERM, INT or HUP before that
# (fleet cancelling the step) stops what it began and leaves `current` alone (abort_start); a start
# killed outright leaves the lock to the kernel (or to the next taker, its owner being gone) and its
# run to `stop --run-id`.
start_run() {
    mkdir -p "${STATE_DIR%/*}" 2>/dev/null
    own_dir "$STATE_DIR" || fail "start: cannot use $STATE_DIR as the launch state dir"
    lock_take "$STATE_DIR/.lock" 0 "start run $RUN_ID" ||
        fail "start: refused: another launch is starting or stopping a run on this node (pid ${HOLDER:-unknown}); wait for it, or check with fleet status"
    trap lock_release EXIT # from here every way out releases the lock; an interruption rolls back
    trap abort_start TERM INT HUP
    # a live process of the current run, or of one whose start was cut short before it was current
    select_run "" && busy && fail "start: refused: run $RDIR_ID is still running ($FACTS); stop it first (fleet stop)"
    for id in $(sh -c "$RUNPROC" runproc live); do
        [ ! -d "$STATE_DIR/$id" ] || [ "$id" = "$RDIR_ID" ] || ! held "$id" ||
            fail "start: refused: run $id is still running ($HELD); stop it first (fleet stop --run-id $id)"
    done
    RDIR=$STATE_DIR/$RUN_ID RDIR_ID=$RUN_ID RUN_CONTAINER=$CONTAINER INNER=$STATE_DIR/$RUN_ID
    [ ! -e "$RDIR" ] || fail "start: refused: run id $RUN_ID was already used on this node"
    { mkdir -m 700 "$RDIR" && : >"$RDIR/log" && printf '%s' "$KEYS" >"$RDIR/env-keys" && : >"$RDIR/cmd"; } ||
        fail "start: cannot create $RDIR"
    RUN_KEY=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
    { [ "${#RUN_KEY}" -eq 32 ] && (umask 077 && put "$RDIR/key" "$RUN_KEY"); } ||
        fail "start: cannot make the run's key in $RDIR"
    [ -z "$WORKDIR" ] || [ -n "$CONTAINER" ] || cd "$WORKDIR" 2>/dev/null ||
        fail "start: workdir $WORKDIR does not exist on this node"
    # "$@" is the command then the --env pairs: the pairs first, then the command (into cmd)
    npairs=$(($# - NCMD))
    while [ "$NCMD" -gt 0 ]; do
        printf '%s\n' "$1" >>"$RDIR/cmd" && set -- "$@" "$1" && shift && NCMD=$((NCMD - 1))
    done
    LAUNCHED=1 # an interruption from here on stops whatever the start began
    if [ -z "$CONTAINER" ]; then
        (with_env "$npairs" "$@" && shift "$npairs" && exec setsid sh -c "$WRAP" fleet-run "$RDIR" env "$@") </dev/null >>"$RDIR/log" 2>&1 9>&- &
    else
        INNER=/tmp/fleet-launch-$RUN_ID
        put "$RDIR/container" "$CONTAINER" && put "$RDIR/inner-dir" "$INNER"
        out=$(with_env "$npairs" "$@" && shift "$npairs" && in_container "$@" 2>&1 9>&-) ||
            { say "$out" && fail "start: docker exec -d into $CONTAINER failed"; }
    fi
    # the launcher's pid, then a short settle: a command that dies at once (not found, bad
    # arguments) is a failed start, recorded all the same (status shows it and its log)
    within 50 launched
    exited=''
    within "$SETTLE_DS" launcher_gone && exited=1
    put "$STATE_DIR/current" "$RUN_ID" && COMMITTED=1
    if [ -n "$exited" ]; then
        tail_log 5
        fail "start: the run exited at once ($FACTS; see $INNER/log)"
    fi
    pid=${FACTS#*launcher_pid=}
    say "started run=$RUN_ID pid=${pid%% *}${RUN_CONTAINER:+ container=$RUN_CONTAINER} log=$INNER/log"
}
# abort_start: TERM, INT or HUP before the commit: stop every process the start began, mark the
# run aborted, leave `current` as it was. Fleet's kill sends KILL 5 s after its TERM; this takes
# about a second.
abort_start() {
    trap '' TERM INT HUP PIPE # finish whatever comes next; set only now (the job inherits ignores)
    [ -z "$COMMITTED" ] || exit 1
    [ -n "$LAUNCHED" ] || fail "start: interrupted before run $RUN_ID started on this node"
    runproc kill "$RUN_ID" 1 >/dev/null 2>&1
    facts
    : >"$RDIR/aborted"
    fail "start: interrupted: run $RUN_ID stopped on this node before it was recorded ($FACTS)"
}
stop_run() {
    # under the lock: a start in flight finishes (or rolls back) first and this stop sees what it
    # recorded; past LOCK_WAIT_S, stop anyway: the run's processes are found by marker
    if [ -d "$STATE_DIR" ]; then
        if lock_take "$STATE_DIR/.lock" "$LOCK_WAIT_S" "stop run ${RUN_ID:-current}"; then
            trap lock_release EXIT
        else
            say "stop: a launch still holds this node's lock (pid ${HOLDER:-unknown}); stopping by marker anyway"
        fi
    fi
    select_run "$RUN_ID" || finish "stop: no run on this node"
    busy || finish "stop: run $RDIR_ID is not running: nothing to stop ($FACTS)"
    : >"$RDIR/stopped"
    runproc kill "$RDIR_ID" "$GRACE"
    rc=$?
    if busy || [ "$rc" != 0 ]; then fail "stop: run $RDIR_ID still has processes after KILL ($FACTS)"; fi
    say "stopped run=$RDIR_ID: none of its processes is left"
}
run_status() {
    select_run "" || finish "run=none"
    facts
    case $FACTS in *launcher=alive*) ;; *) tail_log 5 ;; esac
    stopped=0
    [ ! -e "$RDIR/stopped" ] || stopped=1
    say "run=$RDIR_ID $FACTS stopped=$stopped${RUN_CONTAINER:+ container=$RUN_CONTAINER} log=$INNER/log"
}
run_logs() {
    select_run "$RUN_ID" || fail "logs: no run on this node"
    [ -n "$RUN_CONTAINER" ] || [ -e "$RDIR/log" ] || fail "logs: $RDIR/log not found"
    set -- tail -n "$LINES"
    [ "$FOLLOW" = 0 ] || set -- "$@" -F
    in_run "$@" "$INNER/log"
}

ACTION=${1:-}
[ -n "$ACTION" ] || die_usage "missing ACTION (start, stop, status, logs)"
shift
RUN_ID='' STATE_DIR='' CONTAINER='' RUN_CONTAINER='' RUN_KEY='' WORKDIR='' KEYS='' GRACE=30 LINES=20 FOLLOW=0
LAUNCHED='' COMMITTED='' HOLDER='' SETTLE_DS=${FLEET_LAUNCH_SETTLE_DS:-10}
# the options; each --env pair goes to the end of "$@", after the command (its NCMD words)
NCMD=$#
while [ "$NCMD" -gt 0 ]; do
    case $1 in
        --follow) FOLLOW=1 && shift && NCMD=$((NCMD - 1)) && continue ;;
        --) shift && NCMD=$((NCMD - 1)) && break ;;
        --run-id | --state-dir | --container | --workdir | --env | --grace | --lines) [ "$NCMD" -ge 2 ] || die_usage "$1 needs a value" ;;
        *) die_usage "unknown option '$1'" ;;
    esac
    case $1=$2 in
        --run-id=*) RUN_ID=$2 ;;
        --state-dir=*) tilde "$2" && STATE_DIR=$TILDE ;;
        --container=*) CONTAINER=$2 ;;
        --workdir=*) tilde "$2" && WORKDIR=$TILDE ;;
        --env=[A-Za-z_]*=*)
            case ${2%%=*} in *[!A-Za-z0-9_]*) die_usage "--env '${2%%=*}=...': expected NAME=VALUE" ;; esac
            set -- "$@" "$2" && KEYS="$KEYS${2%%=*}$NL" ;;
        --env=*) die_usage "--env '$2': expected NAME=VALUE" ;;
        --grace=*[!0-9.]* | --grace=) die_usage "--grace '$2' is not a number" ;;
        --grace=*) GRACE=$2 ;;
        --lines=*[!0-9]* | --lines=) die_usage "--lines '$2' is not a number" ;;
        --lines=*) LINES=$2 ;;
    esac
    shift 2
    NCMD=$((NCMD - 2))
done
[ "$ACTION" != start ] || [ "$NCMD" -gt 0 ] || die_usage "start needs a command after --"
[ "$ACTION" != start ] || [ -n "$RUN_ID" ] || die_usage "start needs --run-id"
# no --state-dir (or an empty one): fleet's own, per node; one given must be this uid's own
[ -n "$STATE_DIR" ] || { node_state || exit 1; } && STATE_DIR=${STATE_DIR:-$NODE_STATE/launch}
[ "$ACTION" = start ] || [ ! -e "$STATE_DIR" ] || own_dir "$STATE_DIR" || exit 1
case $RUN_ID in
    current | .* | -* | *[!A-Za-z0-9._+-]*)
        die_usage "bad run id '$RUN_ID': letters, digits, '.', '_', '-', '+', not starting with '.' or '-', not 'current'" ;;
esac
case $ACTION in
    start) start_run "$@" ;;
    stop) stop_run ;;
    status) run_status ;;
    logs) run_logs ;;
    *) die_usage "unknown action '$ACTION' (start, stop, status, logs)" ;;
esac
