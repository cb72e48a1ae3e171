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
# `stopped` once fleet stopped it; `aborted` when its start was interrupted and rolled back; for a
# run inside a container, `container` and `inner-dir` (the wrapper's files and the log are there,
# in the container). DIR/current names the newest run whose start completed.
#
# A start is one transaction on the node, under the node's launch lock (DIR/.lock with flock(1),
# else the directory DIR/.lock.d): check that no run of DIR still has a process, start, wait for
# the launcher, and only then point DIR/current at the run (an atomic rename). A second start
# meanwhile is refused, not raced. A start interrupted before that point (TERM, INT or HUP: fleet
# stopping a cancelled step) stops what it started and leaves DIR/current alone. A start killed
# outright cannot clean up: the kernel drops its flock, and a lock directory whose owner (pid and
# start time) is gone is taken over; fleet then stops the run by its id. stop takes the same lock
# (waiting for a start in flight, up to LOCK_WAIT_S), so it sees what that start committed.
# Run ids are names: letters, digits, '.', '_', '-' and '+', not starting with '.', and never
# `current` (the pointer file); every file of DIR's own starts with '.'.
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

# ---------------------------------------------------------------- the node's launch lock

LOCK_WAIT_S=15
LOCK_KIND=
LOCK_DIR=

# take_lock WAIT_S: hold DIR's launch lock, waiting up to WAIT_S seconds (0: not at all). False
# when another process holds it; HOLDER then says which (its pid and what it is doing). flock(1)
# when the node has it (the kernel drops the lock with its holder, however it dies); else a
# directory, whose owner file makes a dead holder's lock recognisable (break_stale_lock).
take_lock() {
    HOLDER=
    if command -v flock >/dev/null 2>&1; then
        LOCK_KIND='flock'
        # `command exec`: a lock file we may not open must not end the script
        { command exec 9>>"$STATE_DIR/.lock"; } 2>/dev/null || return 1
        if flock -n 9 || { [ "$1" -gt 0 ] && flock -w "$1" 9; }; then
            put "$STATE_DIR/.lock.owner" "$$ $DOING"
            return 0
        fi
        HOLDER=$(cat "$STATE_DIR/.lock.owner" 2>/dev/null)
        exec 9>&-
        LOCK_KIND=
        return 1
    fi
    LOCK_DIR=$STATE_DIR/.lock.d
    waited=0
    while :; do
        if mkdir "$LOCK_DIR" 2>/dev/null; then
            LOCK_KIND='mkdir'
            put "$LOCK_DIR/owner" "$$ $(start_ticks $$) $DOING"
            return 0
        fi
        break_stale_lock && continue
        [ "$waited" -lt "$(($1 * 10))" ] || return 1
        sleep 0.1
        waited=$((waited + 1))
    done
}

# break_stale_lock: remove the lock directory when its owner is gone (a start killed outright);
# true when the caller should try again. The owner is a pid and its start time, so a pid the
# kernel reused does not keep a dead start's lock. The directory is renamed aside before it is
# removed, and its owner compared again there: of two processes breaking one stale lock, only
# one renames it, and a live lock renamed by mistake is put back.
break_stale_lock() {
    owner=$(cat "$LOCK_DIR/owner" 2>/dev/null) || owner=
    if [ -z "$owner" ]; then
        [ -d "$LOCK_DIR" ] || return 0 # released meanwhile
        sleep 1 # its owner writes the file right after mkdir: give it that moment
        owner=$(cat "$LOCK_DIR/owner" 2>/dev/null) || owner=
    fi
    pid=${owner%% *}
    rest=${owner#* }
    HOLDER="$pid ${rest#* }"
    if [ -n "$owner" ] && [ "$(start_ticks "$pid")" = "${rest%% *}" ]; then
        return 1
    fi
    aside=$STATE_DIR/.lock.stale.$$
    mv "$LOCK_DIR" "$aside" 2>/dev/null || return 0 # another process broke it first
    if [ "$(cat "$aside/owner" 2>/dev/null)" != "$owner" ]; then
        [ -e "$LOCK_DIR" ] || mv "$aside" "$LOCK_DIR" 2>/dev/null
        return 1
    fi
    rm -rf "$aside"
    return 0
}

# put FILE TEXT: FILE holds TEXT and a newline, all at once (written aside, then renamed): a
# reader (another fleet's status, stop or start on this node) never sees it half written.
put() { printf '%s\n' "$2" >"$1.tmp.$$" && mv -f "$1.tmp.$$" "$1"; }

release_lock() {
    case $LOCK_KIND in
        flock) rm -f "$STATE_DIR/.lock.owner"; exec 9>&- ;;
        mkdir)
            # only our own: a lock another process holds now is not ours to remove
            [ "$(cut -d' ' -f1 "$LOCK_DIR/owner" 2>/dev/null)" = "$$" ] && rm -rf "$LOCK_DIR"
            ;;
    esac
    LOCK_KIND=
}

start_ticks() {
    # PID: field 22 of /proc/PID/stat (start time in clock ticks), counted after comm's last ')'
    st=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    # shellcheck disable=SC2086 # split into fields on purpose
    set -- ${st##*) }
    [ "$#" -ge 20 ] || return 1
    shift 19
    printf '%s\n' "$1"
}

# The run's wrapper: sh -c "$WRAP" fleet-run RUN_DIR CMD... It records its pid, starts the command
# in the foreground (a shell that first records its own pid, then execs it, so `launcher` is the
# command's pid) and, when the command ends, its exit status (128+N for signal N); each file is
# written aside and renamed, so a probe never reads half of one. A TERM or HUP to the wrapper
# waits for the command instead of abandoning the record; the command itself gets default
# dispositions (a trapped signal is reset on exec, an ignored one would not be).
# shellcheck disable=SC2016 # expanded by the wrapper, not here
WRAP='rdir=$1; shift
trap ": term" TERM
trap ": hup" HUP
echo $$ >"$rdir/pid.tmp" && mv -f "$rdir/pid.tmp" "$rdir/pid"
sh -c '\''echo $$ >"$0.tmp" && mv -f "$0.tmp" "$0"; exec "$@"'\'' "$rdir/launcher" "$@"
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
    DOING="start run $RUN_ID"
    if ! take_lock 0; then
        say "start: refused: another launch is starting or stopping a run on this node (pid ${HOLDER:-unknown}); wait for it, or check with fleet status"
        exit 1
    fi
    # From here every way out releases the lock; an interruption also rolls the start back.
    trap 'release_lock' EXIT
    trap 'abort_start' TERM INT HUP
    refuse_if_busy
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
    RUN_CONTAINER=$CONTAINER
    INNER=$RDIR
    [ -z "$CONTAINER" ] || INNER=/tmp/fleet-launch/$RUN_ID
    LAUNCHED=1 # before the start itself: an interruption from here on stops whatever it started
    if [ -n "$CONTAINER" ]; then
        start_in_container "$@"
    else
        start_on_host "$@"
    fi
    wait_started
}

# refuse_if_busy: no start while the current run, or any run of this state dir, has a live
# process: a run whose start was cut short is not `current`, and still must not get company.
refuse_if_busy() {
    if select_run "" && run_busy; then
        say "start: refused: run $RDIR_ID is still running ($(run_facts)); stop it first (fleet stop)"
        exit 1
    fi
    for id in $(sh -c "$RUNPROC" runproc live); do
        if [ ! -d "$STATE_DIR/$id" ] || [ "$id" = "${RDIR_ID:-}" ]; then continue; fi
        say "start: refused: run $id is still running ($(sh -c "$RUNPROC" runproc probe "$id" "$STATE_DIR/$id")); stop it first (fleet stop --run-id $id)"
        exit 1
    done
}

# commit: the start is done (started, or failed at once with its reason in the log): from now
# on `current` names it, for status, logs, stop and the next start's check.
commit() {
    # aside under a name starting with '.', which no run id has
    printf '%s\n' "$RUN_ID" > "$STATE_DIR/.current.$$" &&
        mv -f "$STATE_DIR/.current.$$" "$STATE_DIR/current"
    COMMITTED=1
}

# abort_start: TERM, INT or HUP before the commit (fleet stopping a cancelled start): stop every
# process the start began, mark the run aborted, leave `current` as it was. Fleet's kill sends
# KILL 5 s after its TERM; the stop here takes about a second.
abort_start() {
    # Finish the rollback whatever comes next: another TERM, or fleet closing the session (its
    # output is not worth dying for). Set only now: ignored signals are inherited by the job.
    trap '' TERM INT HUP PIPE
    if [ -n "$COMMITTED" ]; then
        exit 1
    fi
    if [ -n "$LAUNCHED" ]; then
        runproc kill "$RUN_ID" 1 >/dev/null 2>&1
        left=$(run_facts)
        : > "$RDIR/aborted"
        say "start: interrupted: run $RUN_ID stopped on this node before it was recorded ($left)"
    else
        say "start: interrupted before run $RUN_ID started on this node"
    fi
    exit 1
}

start_on_host() {
    # setsid: new session and process group, detached from this SSH session (PITFALLS 12). The
    # wrapper itself carries the marker too, so a stop finds it with the rest. Not the lock's fd.
    setsid env "FLEET_RUN_ID=$RUN_ID" sh -c "$WRAP" fleet-run "$RDIR" env "$@" \
        </dev/null >>"$RDIR/log" 2>&1 9>&- &
}

start_in_container() {
    put "$RDIR/container" "$CONTAINER"
    put "$RDIR/inner-dir" "$INNER"
    # shellcheck disable=SC2016 # expanded by the shell inside the container
    set -- docker exec -d ${WORKDIR:+-w "$WORKDIR"} -e "FLEET_RUN_ID=$RUN_ID" "$CONTAINER" \
        sh -c 'd=$1 w=$2; shift 2; mkdir -p "$d" && exec sh -c "$w" fleet-run "$d" env "$@" >>"$d/log" 2>&1' \
        fleet-start "$INNER" "$WRAP" "$@"
    if ! out=$("$@" 2>&1 9>&-); then
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
        # Recorded all the same: status shows this failure and its log.
        commit
        show_log_tail 5
        say "start: the run exited at once ($(run_facts); see $(log_path))"
        exit 1
    fi
    pid=$(run_facts | sed -n 's/.* launcher_pid=\([0-9]*\) .*/\1/p')
    commit
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
    # Under the lock, so that a start in flight finishes (or rolls back) first and this stop sees
    # what it recorded; past LOCK_WAIT_S, stop anyway: the run's processes are found by marker.
    DOING="stop run ${RUN_ID:-current}"
    if [ -d "$STATE_DIR" ]; then
        if take_lock "$LOCK_WAIT_S"; then
            trap 'release_lock' EXIT
        else
            say "stop: a launch still holds this node's lock (pid ${HOLDER:-unknown}); stopping by marker anyway"
        fi
    fi
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
DOING=
HOLDER=
LAUNCHED=
COMMITTED=
RUN_CONTAINER=
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
# A run id names a directory beside `current` and the lock files: a plain name, never one of those.
case $RUN_ID in
    current | .* | -* | *[!A-Za-z0-9._+-]*) die_usage "bad run id '$RUN_ID': letters, digits, '.', '_', '-', '+', not starting with '.' or '-', not 'current'" ;;
esac

case $ACTION in
    start)
        [ -n "$RUN_ID" ] || die_usage "start needs --run-id"
        [ $# -gt 0 ] || die_usage "start needs a command after --"
        action_start "$@"
        ;;
    stop) action_stop ;;
    status) action_status ;;
    logs) action_logs ;;
    *) die_usage "unknown action '$ACTION' (start, stop, status, logs)" ;;
esac
