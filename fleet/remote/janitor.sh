#!/bin/sh
# fleet/remote/janitor.sh: the checkpoint janitor on this node: a detached loop that deletes
# unwanted checkpoint artifacts (ZeRO optimizer/model-state shards, scheduler and RNG state)
# under one output directory every few seconds, so a run cannot fill the disk (PITFALLS 18, 19).
#
# fleet feeds this script on stdin:  sh -s -- ACTION [OPTIONS] < janitor.sh
#
#   start    --dir DIR [--interval S] [--min-age S] --delete GLOB... [--keep GLOB...]
#            [--allow-weights]
#   stop     --dir DIR
#   status   [--dir DIR]      without --dir: one line per janitor known on this node
#   run-once --dir DIR [--min-age S] --delete GLOB... [--keep GLOB...] [--allow-weights]
#            [--dry-run]
#   loop     (internal) the daemon body, in the foreground
#
# What is deleted: regular files under DIR whose name matches a --delete glob and no --keep glob
# (keep always wins), modified more than --min-age seconds ago (younger ones may still be being
# written: a later pass takes them), that no process holds open or mapped. Symlinks are never
# followed, DIR's filesystem is never left, no mount point under DIR is entered (a bind mount
# of the same filesystem included), nothing outside DIR is ever deleted. The pass itself is
# janitor-loop.sh, carried inside this script by fleet (the line below).
#
# A --delete glob that would take a final model's weights, config or tokenizer (it matches a
# name in PROTECTED_NAMES below that no --keep glob matches: `*.*` and `[!.]*` do) is refused,
# naming those files, unless --allow-weights is given. fleet checks the globs themselves
# against its protected patterns before connecting (fleet/deletion.py); this is the node's own
# check, for playbooks run by hand.
#
# DIR must be an existing absolute directory on this node (it is never created), and not `/`,
# the home directory or a system directory, before or after resolving symlinks.
#
# State per DIR: ${XDG_STATE_HOME:-~/.local/state}/fleet/janitor/<cksum of DIR>/ with dir,
# config, janitor-loop.sh (what the daemon runs), pid and starttime (a recycled pid is never
# signalled), stats (deleted=N, freed_bytes=N; counted since the last start) and log (one
# timestamped line per deletion). The daemon runs under setsid with all three streams redirected,
# so it survives the SSH session and the session does not hang on it (PITFALLS 12).
#
# Exit: 0 ok, 1 refused or failed (reason on the last line), 2 bad usage.
#
# fleet:include janitor-loop.sh as JANITOR_LOOP

LC_ALL=C
export LC_ALL
NL='
'
JANITOR_LOOP=${JANITOR_LOOP:-}
if [ -z "$JANITOR_LOOP" ] && [ -f "${0%/*}/janitor-loop.sh" ]; then
    JANITOR_LOOP=$(cat "${0%/*}/janitor-loop.sh") # run from a checkout: sh fleet/remote/janitor.sh
fi

say() { printf '%s\n' "$*"; }
refuse() { say "janitor: refused: $*"; exit 1; }
die_usage() { printf 'janitor.sh: %s\n' "$*" >&2; exit 2; }

# human BYTES: 1.2 MB style (powers of 1000), exact below 1 kB.
human() {
    awk -v b="$1" 'BEGIN {
        n = split("kB MB GB TB PB EB", u, " ")
        if (b < 1000) { printf "%.0f B\n", b; exit }
        for (i = 1; i < n && b >= 999950; i++) b /= 1000
        printf "%.1f %s\n", b / 1000, u[i]
    }'
}

# words LIST: a newline-separated list on one line, space-separated.
words() { printf '%s\n' "$1" | paste -s -d ' ' -; }

# ------------------------------------------------------------------ processes

# proc_stat PID: the fields after comm of /proc/PID/stat into PS_STATE PS_PGRP PS_START.
proc_stat() {
    ps_line=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    ps_rest=${ps_line##*) }
    # shellcheck disable=SC2086 # split the fields on purpose
    set -- $ps_rest
    [ $# -ge 20 ] || return 1
    PS_STATE=$1 PS_PGRP=$3
    shift 19
    PS_START=$1
}

# alive: the janitor recorded in STATE is running (same pid and start time, not a zombie);
# sets PID.
alive() {
    PID=$(cat "$STATE/pid" 2>/dev/null) || return 1
    case $PID in '' | *[!0-9]*) return 1 ;; esac
    proc_stat "$PID" || return 1
    [ "$PS_STATE" != Z ] && [ "$PS_START" = "$(cat "$STATE/starttime" 2>/dev/null)" ]
}

uptime_s() {
    proc_stat "$1" || { echo 0; return; }
    ticks=$(getconf CLK_TCK 2>/dev/null) || ticks=100
    up=$(cut -d' ' -f1 /proc/uptime)
    echo $((${up%.*} - PS_START / ticks))
}

# ------------------------------------------------------------------ the directory

# unsafe PATH: why PATH may never be a janitor's directory, or nothing.
unsafe() {
    case $1 in
        / | "") echo "$1 is the root directory" ;;
        /bin | /boot | /dev | /etc | /home | /lib | /lib32 | /lib64 | /libx32 | /proc | /root | \
            /run | /sbin | /sys | /tmp | /usr | /var)
            echo "$1 is a system directory" ;;
        /bin/* | /boot/* | /etc/* | /lib/* | /lib32/* | /lib64/* | /libx32/* | /proc/* | \
            /sbin/* | /sys/* | /usr/*)
            echo "$1 is inside a system directory" ;;
        "$HOME" | "$HOME_REAL") echo "$1 is the home directory" ;;
    esac
}

# resolve_dir GIVEN: DIR = GIVEN made absolute (~ expanded, trailing / dropped) and, when it
# exists, physical (symlinks resolved); DIR_EXISTS=1 when it is a directory here. Refuses
# empty, relative and unsafe paths.
resolve_dir() {
    d=$1
    # shellcheck disable=SC2088 # a literal "~/" prefix, expanded here on purpose
    case $d in
        "~") d=$HOME ;;
        "~/"*) d=$HOME/${d#"~/"} ;;
    esac
    [ -n "$d" ] || refuse "--dir is empty (set output_dir in the inventory, or pass --dir)"
    case $d in
        /*) ;;
        *) refuse "--dir '$d' is relative: give an absolute path" ;;
    esac
    while :; do
        case $d in
            /) break ;;
            */) d=${d%/} ;;
            *) break ;;
        esac
    done
    HOME_REAL=$(cd -P "$HOME" 2>/dev/null && pwd -P) || HOME_REAL=$HOME
    why=$(unsafe "$d")
    [ -z "$why" ] || refuse "--dir $why"
    DIR=$d
    DIR_EXISTS=0
    if [ -d "$d" ]; then
        DIR=$(cd -P "$d" 2>/dev/null && pwd -P) || refuse "cannot enter $d"
        DIR_EXISTS=1
        why=$(unsafe "$DIR")
        [ -z "$why" ] || refuse "--dir $d resolves to $why"
    elif [ -e "$d" ] || [ -L "$d" ]; then
        refuse "--dir $d is not a directory"
    fi
}

missing() { refuse "no such directory on this host: $DIR (wrong host or typo?)"; }

state_base() {
    sb=${XDG_STATE_HOME:-}
    case $sb in /*) ;; *) sb=$HOME/.local/state ;; esac
    printf '%s/fleet/janitor\n' "$sb"
}

# find_state: STATE = this DIR's state dir (it may not exist yet).
find_state() {
    key=$(printf %s "$DIR" | cksum 2>/dev/null | cut -d' ' -f1)
    [ -n "$key" ] || key=$(printf %s "$DIR" | md5sum 2>/dev/null | cut -c1-16) # no cksum (busybox)
    case $key in '' | *[!0-9a-f]*) refuse "cannot derive a state dir name: cksum is missing" ;; esac
    STATE=$(state_base)/$key
    if [ -f "$STATE/dir" ] && [ "$(cat "$STATE/dir")" != "$DIR" ]; then
        refuse "state dir $STATE already belongs to $(cat "$STATE/dir") (checksum clash)"
    fi
}

stat_of() { v=$(sed -n "s/^$1=//p" "$STATE/stats" 2>/dev/null); echo "${v:-0}"; }

# ------------------------------------------------------------------ options

check_options() {
    case $INTERVAL in '' | *[!0-9.]* | *.*.* | .) refuse "--interval '$INTERVAL' is not a number of seconds" ;; esac
    case $INTERVAL in *[1-9]*) ;; *) refuse "--interval must be more than 0 seconds" ;; esac
    case $MIN_AGE in '' | *[!0-9.]* | *.*.* | .) refuse "--min-age '$MIN_AGE' is not a number of seconds" ;; esac
    # whole seconds, a fraction rounded up (safer); no leading zeros (octal in $((...)))
    ma=${MIN_AGE%%.*}
    ma=${ma#"${ma%%[!0]*}"}
    case $MIN_AGE in *.*[1-9]*) MIN_AGE=$((${ma:-0} + 1)) ;; *) MIN_AGE=${ma:-0} ;; esac
    [ -n "$DELETES" ] || refuse "no --delete glob given: nothing to delete"
    while IFS= read -r g; do
        case $g in
            '') refuse "an empty --delete glob" ;;
            */*) refuse "--delete '$g': globs match file names, not paths (no /)" ;;
            *[!*?]*) ;;
            *) refuse "--delete '$g' matches every file" ;;
        esac
    done <<EOF
$DELETES
EOF
    while IFS= read -r g; do
        case $g in
            */*) refuse "--keep '$g': globs match file names, not paths (no /)" ;;
        esac
    done <<EOF
$KEEPS
EOF
    [ "$ALLOW_WEIGHTS" = 1 ] || check_protected
}

# What a finished training run saves as its model (Hugging Face transformers/PEFT/diffusers,
# Meta's consolidated checkpoints, GGUF/ONNX exports): weights, shard indexes, configs and
# tokenizers. One example name per pattern of fleet's PROTECTED_GLOBS (fleet/deletion.py),
# which keeps the two lists in step: a shell cannot intersect two globs, so the node tests
# names. Never the ZeRO shards the janitor exists for: mp_rank_*_model_states.pt is not here.
PROTECTED_NAMES='model.safetensors
model-00001-of-00004.safetensors
adapter_model.safetensors
model.safetensors.index.json
pytorch_model.bin
pytorch_model-00001-of-00002.bin
pytorch_model.bin.index.json
model.bin
adapter_model.bin
config.json
generation_config.json
adapter_config.json
preprocessor_config.json
tokenizer.json
tokenizer_config.json
tokenizer.model
spiece.model
special_tokens_map.json
added_tokens.json
vocab.json
vocab.txt
merges.txt
chat_template.jinja
chat_template.json
model.gguf
model.onnx
tf_model.h5
flax_model.msgpack
consolidated.00.pth
params.json'

# matches NAME GLOBS: NAME matches one of the newline-separated GLOBS (as find -name would).
matches() {
    while IFS= read -r mt_glob; do
        [ -n "$mt_glob" ] || continue
        # shellcheck disable=SC2254 # the glob is a pattern on purpose
        case $1 in $mt_glob) return 0 ;; esac
    done <<EOF
$2
EOF
    return 1
}

# check_protected: refuse every --delete glob that takes a PROTECTED_NAMES name no --keep
# glob saves, naming the glob and the names, all on one line.
check_protected() {
    cp_why=
    while IFS= read -r cp_glob; do
        cp_names=
        while IFS= read -r cp_name; do
            matches "$cp_name" "$cp_glob" || continue
            matches "$cp_name" "$KEEPS" && continue
            cp_names="${cp_names:+$cp_names, }$cp_name"
        done <<EOF
$PROTECTED_NAMES
EOF
        [ -z "$cp_names" ] ||
            cp_why="$cp_why--delete '$cp_glob' would delete final model weights or configs: $cp_names; "
    done <<EOF
$DELETES
EOF
    [ -z "$cp_why" ] || refuse "${cp_why}narrow the glob, --keep those files, or pass --allow-weights"
}

globs_line() { printf 'deleting %s, keeping %s' "$(words "$DELETES")" "$(words "${KEEPS:-none}")"; }

# ------------------------------------------------------------------ actions

# The state dir's lock, held by start (from its check that no janitor runs until the new one
# has written its pid) and by stop: two fleets starting or stopping one janitor take turns.
# flock(1) on STATE/lock.f when the node has it (the kernel drops it with its holder, however it
# dies); else the directory STATE/lock, taken over once older than a minute (a killed start's).
LOCKED=
unlock() {
    case $LOCKED in
        flock) exec 8>&- ;;
        mkdir) rmdir "$STATE/lock" 2>/dev/null ;;
    esac
    LOCKED=
}

lock() {
    trap unlock EXIT
    trap 'exit 130' INT TERM HUP
    if command -v flock >/dev/null 2>&1 && { command exec 8>>"$STATE/lock.f"; } 2>/dev/null; then
        LOCKED='flock'
        flock -w 10 8 || refuse "another janitor start or stop for $DIR is in progress ($STATE/lock.f)"
        return 0
    fi
    i=0
    until mkdir "$STATE/lock" 2>/dev/null; do
        age=$(($(date +%s) - $(stat -c %Y "$STATE/lock" 2>/dev/null || date +%s)))
        if [ "$age" -gt 60 ]; then
            rmdir "$STATE/lock" 2>/dev/null # left by a start that was killed
        elif [ $i -ge 100 ]; then
            refuse "another janitor start for $DIR is in progress ($STATE/lock)"
        fi
        sleep 0.1
        i=$((i + 1))
    done
    LOCKED='mkdir'
}

# prepare: under the lock, with no janitor running for DIR: write the state the daemon needs.
put() { printf '%s\n' "$2" >"$STATE/$1.tmp" && mv -f "$STATE/$1.tmp" "$STATE/$1"; }

prepare() {
    rm -f "$STATE/pid" "$STATE/starttime"
    config=$(printf 'dir=%s\ninterval=%s\nmin_age=%s\n' "$DIR" "$INTERVAL" "$MIN_AGE"
        printf '%s\n' "$DELETES" | sed 's/^/delete=/'
        [ -z "$KEEPS" ] || printf '%s\n' "$KEEPS" | sed 's/^/keep=/')
    if ! { put dir "$DIR" && put config "$config" && put stats "deleted=0${NL}freed_bytes=0" &&
        put janitor-loop.sh "$JANITOR_LOOP" && : >>"$STATE/log"; }; then
        refuse "cannot write the janitor's state in $STATE"
    fi
}

action_start() {
    [ "$DIR_EXISTS" = 1 ] || missing
    check_options
    command -v setsid >/dev/null 2>&1 || refuse "setsid (util-linux) is not installed on this host"
    find_state
    umask 077
    mkdir -p "$STATE" || refuse "cannot create $STATE"
    lock
    if alive; then
        say "janitor: already running for $DIR (pid $PID, up $(uptime_s "$PID")s)"
        exit 0
    fi
    prepare
    set -- loop --dir "$DIR" --state "$STATE" --interval "$INTERVAL" --min-age "$MIN_AGE"
    while IFS= read -r g; do set -- "$@" --delete "$g"; done <<EOF
$DELETES
EOF
    while IFS= read -r g; do [ -z "$g" ] || set -- "$@" --keep "$g"; done <<EOF
$KEEPS
EOF
    if [ "$ACTION" = loop ]; then
        unlock
        exec sh "$STATE/janitor-loop.sh" "$@"
    fi
    # setsid: own session and process group, no controlling terminal; cd / so the daemon never
    # holds a mount busy; no inherited fd but the log (one on a file in DIR would pin it as "in
    # use" for as long as the daemon lives). The loop writes its own pid and start time.
    (cd / && exec setsid sh "$STATE/janitor-loop.sh" "$@" </dev/null >>"$STATE/log" 2>&1 \
        3<&- 4<&- 5<&- 6<&- 7<&- 8<&- 9<&-) &
    i=0
    until alive || [ $i -ge 50 ]; do
        sleep 0.1
        i=$((i + 1))
    done
    if ! alive; then
        tail -n 5 "$STATE/log" 2>/dev/null
        refuse "the janitor did not start for $DIR (see $STATE/log)"
    fi
    say "janitor: started for $DIR (pid $PID, every ${INTERVAL}s, files older than ${MIN_AGE}s, $(globs_line))"
}

# signal_janitor SIG: signal the janitor's process group (it leads one: setsid), else its pid.
signal_janitor() {
    if proc_stat "$PID" && [ "$PS_PGRP" = "$PID" ]; then
        kill -"$1" -"$PID" 2>/dev/null || kill -"$1" "$PID" 2>/dev/null
    else
        kill -"$1" "$PID" 2>/dev/null
    fi
}

wait_gone() {
    i=0
    while alive && [ $i -lt "$1" ]; do
        sleep 0.1
        i=$((i + 1))
    done
    ! alive
}

action_stop() {
    find_state
    if [ "$DIR_EXISTS" != 1 ] && [ ! -f "$STATE/dir" ]; then
        say "janitor: not running for $DIR (no such directory on this host)"
        exit 0
    fi
    [ ! -d "$STATE" ] || lock # a start in flight finishes first; its pid files are not ours
    if ! alive; then
        rm -f "$STATE/pid" "$STATE/starttime" 2>/dev/null
        say "janitor: not running for $DIR"
        exit 0
    fi
    pid=$PID
    signal_janitor TERM
    if ! wait_gone 50; then
        alive && signal_janitor KILL
        wait_gone 50 || refuse "janitor pid $pid for $DIR survived SIGKILL"
    fi
    rm -f "$STATE/pid" "$STATE/starttime"
    n=$(stat_of deleted)
    say "janitor: stopped for $DIR (pid $pid; deleted $n file$([ "$n" = 1 ] || echo s), freed $(human "$(stat_of freed_bytes)"))"
}

status_line() {
    free=$(df -Pk "$DIR" 2>/dev/null | awk 'NR == 2 { printf "%.0f", $4 * 1024 }')
    tail="deleted=$(stat_of deleted) freed_bytes=$(stat_of freed_bytes) free_bytes=${free:-unknown}"
    if alive; then
        say "janitor=running dir=$DIR pid=$PID uptime_s=$(uptime_s "$PID") $tail"
    else
        say "janitor=stopped dir=$DIR $tail"
    fi
}

action_status() {
    if [ "$DIR_GIVEN" = 1 ]; then
        find_state
        if [ "$DIR_EXISTS" != 1 ] && [ ! -f "$STATE/dir" ]; then
            # read-only, and `fleet status` asks before the first run has created the dir
            say "janitor=none dir=$DIR reason=no-such-directory"
            return
        fi
        status_line
        return
    fi
    found=0
    for STATE in "$(state_base)"/*; do
        [ -f "$STATE/dir" ] || continue
        DIR=$(cat "$STATE/dir")
        status_line
        found=1
    done
    [ "$found" = 1 ] || say "janitor=none"
}

action_run_once() {
    [ "$DIR_EXISTS" = 1 ] || missing
    INTERVAL=1
    check_options
    find_state
    set -- once --dir "$DIR" --min-age "$MIN_AGE"
    while IFS= read -r g; do set -- "$@" --delete "$g"; done <<EOF
$DELETES
EOF
    while IFS= read -r g; do [ -z "$g" ] || set -- "$@" --keep "$g"; done <<EOF
$KEEPS
EOF
    [ "$DRY_RUN" = 1 ] && set -- "$@" --dry-run
    # Deletions also go to the janitor's log when one was ever started for DIR.
    [ "$DRY_RUN" = 1 ] || [ ! -f "$STATE/dir" ] || set -- "$@" --log "$STATE/log"
    exec sh -c "$JANITOR_LOOP" janitor-loop "$@"
}

# ------------------------------------------------------------------ arguments

ACTION=${1:-}
[ -n "$ACTION" ] || die_usage "missing ACTION (start, stop, status, run-once)"
shift
DIR=
DIR_GIVEN=0
INTERVAL=3
MIN_AGE=10
DELETES=
KEEPS=
DRY_RUN=0
ALLOW_WEIGHTS=0
while [ $# -gt 0 ]; do
    case $1 in
        --dir) [ $# -ge 2 ] || die_usage "--dir needs a value"; DIR=$2; DIR_GIVEN=1; shift 2 ;;
        --interval) [ $# -ge 2 ] || die_usage "--interval needs seconds"; INTERVAL=$2; shift 2 ;;
        --min-age) [ $# -ge 2 ] || die_usage "--min-age needs seconds"; MIN_AGE=$2; shift 2 ;;
        --delete) [ $# -ge 2 ] || die_usage "--delete needs a glob"; DELETES=${DELETES:+$DELETES$NL}$2; shift 2 ;;
        --keep) [ $# -ge 2 ] || die_usage "--keep needs a glob"; KEEPS=${KEEPS:+$KEEPS$NL}$2; shift 2 ;;
        --dry-run) DRY_RUN=1; shift ;;
        --allow-weights) ALLOW_WEIGHTS=1; shift ;;
        *) die_usage "unknown option '$1'" ;;
    esac
done
case $ACTION in
    start | stop | status | run-once | loop) ;;
    *) die_usage "unknown action '$ACTION' (start, stop, status, run-once)" ;;
esac
if [ -z "$JANITOR_LOOP" ]; then
    say "janitor: janitor-loop.sh is missing: run this script through fleet (fleet janitor)"
    exit 1
fi
if [ "$DIR_GIVEN" = 1 ] || [ "$ACTION" != status ]; then
    resolve_dir "$DIR"
fi
[ "$DRY_RUN" = 0 ] || [ "$ACTION" = run-once ] || die_usage "--dry-run is for run-once only"

case $ACTION in
    start | loop) action_start ;;
    stop) action_stop ;;
    status) action_status ;;
    run-once) action_run_once ;;
esac
