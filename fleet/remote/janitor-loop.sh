#!/bin/sh
# fleet/remote/janitor-loop.sh: the checkpoint janitor, a detached loop deleting unwanted checkpoint
# files (ZeRO optimizer/model-state shards, scheduler and RNG state) under one output dir every few
# seconds, so a run cannot fill the disk (PITFALLS 18, 19). janitor.sh, which fleet feeds the node,
# runs this text with its arguments and hands it the text itself (JANITOR_LOOP) for the daemon:
#
#   start    --dir DIR [--interval S] [--min-age S] --delete GLOB... [--keep GLOB...] [--allow-weights]
#   stop     --dir DIR
#   status   [--dir DIR]      without --dir: a line per janitor of this node
#   run-once --dir DIR [--min-age S] --delete GLOB... [--keep GLOB...] [--allow-weights] [--dry-run]
#   loop     --dir DIR --state STATE   the daemon, run by start from STATE/janitor-loop.sh
#
# What a pass deletes: candidates, open_files, delete_one; what DIR may be: resolve_dir; globs
# refused: check_options. The daemon runs under setsid in /, streams redirected: it outlives the
# SSH session without holding it (PITFALLS 12), and exits when DIR is removed or replaced, or
# STATE/pid stops naming it.
# Exit: 0 ok, 1 refused or failed (reason on the last line), 2 bad usage.
# shellcheck disable=SC2034 # read by die_usage (lib.sh)
SCRIPT=janitor.sh
# fleet:source lib.sh
TAB='	'

refuse() { fail "janitor: refused: $*"; }
note() { if [ "$ACTION" = loop ]; then say "$(date -u +%Y-%m-%dT%H:%M:%SZ) $*"; else say "$*"; fi }
words() { printf '%s\n' "$1" | paste -s -d ' ' -; }
files() { if [ "$1" -eq 1 ]; then printf '1 file'; else printf '%s files' "$1"; fi; }
stat_of() { v=$(sed -n "s/^$1=//p" "$STATE/stats" 2>/dev/null) && echo "${v:-0}"; }

# human BYTES: 1.2 MB style (powers of 1000), exact below 1 kB.
human() {
    awk -v b="$1" 'BEGIN { split("kB MB GB TB PB EB", u, " "); if (b < 1000) { printf "%.0f B\n", b; exit }
        for (i = 1; i < 6 && b >= 999950; i++) b /= 1000; printf "%.1f %s\n", b / 1000, u[i] }'
}

unsafe() { # PATH WHAT: refuse, as WHAT, a PATH that may never be a janitor's directory
    case $1 in
        / | "") refuse "$2 $1 is the root directory" ;;
        /bin | /boot | /dev | /etc | /home | /lib | /lib32 | /lib64 | /libx32 | /proc | /root | /run | /sbin | \
            /sys | /tmp | /usr | /var) refuse "$2 $1 is a system directory" ;;
        /bin/* | /boot/* | /etc/* | /lib/* | /lib32/* | /lib64/* | /libx32/* | /proc/* | /sbin/* | /sys/* | /usr/*)
            refuse "$2 $1 is inside a system directory" ;;
        "$HOME" | "$HOME_REAL") refuse "$2 $1 is the home directory" ;;
    esac
}
# resolve_dir GIVEN: DIR = GIVEN absolute (~ expanded, trailing / dropped) and physical when it
# exists (DIR_EXISTS=1); refuses empty, relative and unsafe paths.
resolve_dir() {
    tilde "$1"
    d=$TILDE
    [ -n "$d" ] || refuse "--dir is empty (set output_dir in the inventory, or pass --dir)"
    case $d in /*) ;; *) refuse "--dir '$d' is relative: give an absolute path" ;; esac
    while [ "$d" != / ] && [ "${d%/}" != "$d" ]; do d=${d%/}; done
    HOME_REAL=$(cd -P "$HOME" 2>/dev/null && pwd -P) || HOME_REAL=$HOME
    unsafe "$d" --dir
    DIR=$d DIR_EXISTS=0
    if [ -d "$d" ]; then
        DIR=$(cd -P "$d" 2>/dev/null && pwd -P) || refuse "cannot enter $d"
        DIR_EXISTS=1
        unsafe "$DIR" "--dir $d resolves to"
    elif [ -e "$d" ] || [ -L "$d" ]; then
        refuse "--dir $d is not a directory"
    fi
}
# find_state: BASE, NODE_STATE/janitor (lib.sh's node_state: per node, never a shared home), and
# DIR's STATE = BASE/<cksum of DIR> (it may not exist yet): dir, config (what the daemon runs with), janitor-loop.sh, pid and
# starttime (a recycled pid is never signalled), stats (deleted=N freed_bytes=N since the last
# start), log (a timestamped line per deletion) and lock (start and stop take turns). A pass's
# reference time (REF) is BASE/.ref.*: never /tmp, which any user can fill.
find_state() {
    node_state || refuse "no state dir of fleet's own on this node"
    BASE=$NODE_STATE/janitor
    own_dir "$BASE" || refuse "cannot use $BASE"
    key=$(printf %s "$DIR" | cksum 2>/dev/null | cut -d' ' -f1)
    case $key in '' | *[!0-9]*) refuse "cannot derive a state dir name: cksum is missing" ;; esac
    STATE=$BASE/$key
    [ ! -f "$STATE/dir" ] || [ "$(cat "$STATE/dir")" = "$DIR" ] ||
        refuse "state dir $STATE already belongs to $(cat "$STATE/dir") (checksum clash)"
}
# alive: the janitor STATE records runs (that pid, with that start time, no zombie); sets PID.
alive() {
    PID=$(cat "$STATE/pid" 2>/dev/null) && case $PID in '' | *[!0-9]*) false ;; esac &&
        proc_is "$PID" "$(cat "$STATE/starttime" 2>/dev/null)"
}
dead() { ! alive; }

lock() {
    trap lock_release EXIT
    trap 'exit 130' INT TERM HUP
    lock_take "$STATE/lock" 10 "janitor $ACTION" ||
        refuse "another janitor start or stop for $DIR is in progress (pid ${HOLDER:-unknown})"
}
# check_options: refuse bad numbers and globs, round --min-age up to whole seconds, set CONFIG
# (what the daemon runs with: interval=, min_age=, a delete= and keep= line per glob).
check_options() {
    for v in "--interval $INTERVAL" "--min-age $MIN_AGE"; do
        case ${v#* } in '' | *[!0-9.]* | *.*.* | .) refuse "${v%% *} '${v#* }' is not a number of seconds" ;; esac
    done
    case $INTERVAL in *[1-9]*) ;; *) refuse "--interval must be more than 0 seconds" ;; esac
    ma=${MIN_AGE%%.*} # no leading 0 in $((...)): octal
    ma=${ma#"${ma%%[!0]*}"}
    case $MIN_AGE in *.*[1-9]*) MIN_AGE=$((${ma:-0} + 1)) ;; *) MIN_AGE=${ma:-0} ;; esac
    [ -n "$DELETES" ] || refuse "no --delete glob given: nothing to delete"
    CONFIG="interval=$INTERVAL${NL}min_age=$MIN_AGE$NL$(printf '%s\n' "$DELETES" | sed 's/^/delete=/')"
    [ -z "$KEEPS" ] || CONFIG="$CONFIG$NL$(printf '%s\n' "$KEEPS" | sed 's/^/keep=/')"
    set -f; IFS=$NL
    for l in $CONFIG; do
        case $l in
            delete=) refuse "an empty --delete glob" ;;
            *=*/*) refuse "--${l%%=*} '${l#*=}': globs match file names, not paths (no /)" ;;
            *=*\{*,*\}*) refuse "--${l%%=*} '${l#*=}': no {a,b} alternatives (find reads them literally): give one --${l%%=*} per alternative" ;;
            delete=*[!*?]*) ;;
            delete=*) refuse "--delete '${l#*=}' matches every file" ;;
        esac
    done
    IFS=$DEFAULT_IFS; set +f
    [ "$ALLOW_WEIGHTS" = 1 ] || check_protected
}
# What a finished run saves as its model (Hugging Face weights, shard indexes, configs and
# tokenizers, Meta's consolidated checkpoints, GGUF/ONNX/TF/Flax exports): one example name per
# pattern of fleet's PROTECTED_GLOBS (fleet/node/deletion.py; a shell cannot intersect two globs, so
# the node tests names). Never the ZeRO shards the janitor exists for.
PROTECTED_NAMES='model.safetensors model-00001-of-00004.safetensors adapter_model.safetensors
model.safetensors.index.json pytorch_model.bin pytorch_model-00001-of-00002.bin
pytorch_model.bin.index.json model.bin adapter_model.bin config.json generation_config.json
adapter_config.json preprocessor_config.json tokenizer.json tokenizer_config.json tokenizer.model
spiece.model special_tokens_map.json added_tokens.json vocab.json vocab.txt merges.txt
chat_template.jinja chat_template.json model.gguf model.onnx tf_model.h5 flax_model.msgpack
consolidated.00.pth params.json'

# check_protected: refuse, on one line, every --delete glob taking a protected name that no
# --keep glob saves, with those names.
check_protected() {
    why=
    set -f; IFS=$NL
    for g in $DELETES; do
        taken=
        IFS=$DEFAULT_IFS
        for n in $PROTECTED_NAMES; do
            # shellcheck disable=SC2254 # the glob is a pattern
            case $n in $g) kept "$n" || taken="${taken:+$taken, }$n" ;; esac
        done
        [ -z "$taken" ] || why="$why--delete '$g' would delete final model weights or configs: $taken; "
    done
    IFS=$DEFAULT_IFS; set +f
    [ -z "$why" ] || refuse "${why}narrow the glob, --keep those files, or pass --allow-weights"
}

kept() { # NAME matches a --keep glob (globbing off, as check_protected has it)
    IFS=$NL
    # shellcheck disable=SC2254 # the glob is a pattern
    for k in $KEEPS; do case $1 in $k) IFS=$DEFAULT_IFS && return 0 ;; esac; done
    IFS=$DEFAULT_IFS
    false
}
# mount_points: each mount point strictly under DIR, as a find -path pattern (\ * ? [ escaped),
# from mountinfo's field 5 (octal escapes undone). One holding a newline is left out: no path
# below it is ever a candidate. False without a mount table.
mount_points() {
    [ -r /proc/self/mountinfo ] || return 1
    JANITOR_DIR=$DIR awk -v f=5 'BEGIN { under = ENVIRON["JANITOR_DIR"] "/" }
    {   s = $f; p = ""
        while ((i = index(s, "\\")) > 0) {
            c = substr(s, i + 1, 3); p = p substr(s, 1, i - 1)
            if (c ~ /^[0-7][0-7][0-7]$/) { p = p sprintf("%c", substr(c, 1, 1) * 64 + substr(c, 2, 1) * 8 + substr(c, 3, 1)); s = substr(s, i + 4) }
            else { p = p "\\"; s = substr(s, i + 1) }
        }
        p = p s
        if (index(p, under) != 1 || index(p, "\n") > 0) next
        q = ""; for (i = 1; i <= length(p); i++) { c = substr(p, i, 1); q = q (index("\\*?[", c) ? "\\" : "") c }
        print q
    }' /proc/self/mountinfo
}
# mount_id [PATH]: the id of the mount PATH (default .) is on (Linux 3.15+; else nothing). A bind
# mount has one of its own even where its device number is DIR's.
mount_id() { sed -n 's/^mnt_id:[[:space:]]*//p' /proc/self/fdinfo/3 2>/dev/null 3<"${1:-.}"; }

# candidates: "SIZE MTIME PATH" per regular file under DIR matching a --delete glob and no --keep
# glob: -P never follows a symlink, -xdev stays on DIR's filesystem, every mount point under DIR is
# pruned, a path with a newline is skipped. False, listing nothing, without a mount table.
candidates() {
    cd_mounts=$(mount_points) || return 1
    set -- -P "$DIR" -xdev
    cd_or="("
    set -f; IFS=$NL
    for cd_m in $cd_mounts; do set -- "$@" "$cd_or" -path "$cd_m" && cd_or=-o; done
    [ "$cd_or" = "(" ] || set -- "$@" ")" -prune -o
    set -- "$@" ! -path "*$NL*" -type f
    cd_or="("
    for cd_g in $DELETES; do set -- "$@" "$cd_or" -name "$cd_g" && cd_or=-o; done
    set -- "$@" ")"
    for cd_g in $KEEPS; do set -- "$@" ! -name "$cd_g"; done
    IFS=$DEFAULT_IFS; set +f
    # an unreadable subdirectory makes find exit 1 after listing the rest: not a failed pass. Its
    # complaints follow the list as "! MESSAGE" lines, for pass to log once while they last
    { cd_err=$(find "$@" -exec stat -c '%s %Y %n' {} + 2>&1 >&3 3>&-); } 3>&1
    [ -z "$cd_err" ] || printf '%s\n' "$cd_err" | sed 's/^/! /'
}
# open_files: "PATH<TAB>PID" per file under DIR a process holds open or mapped (one ls over /proc,
# one grep over every maps file); never this shell's own fds. Only a hold by root, this uid or the
# file's owner counts: any user may open a file they can read, and a stranger's reader would keep
# the run's shards for good (an unlinked file stays readable through the fd).
open_files() {
    of_me=$(id -u)
    open_holds | while IFS= read -r of_l; do
        of_u=$(sed -n 's/^Uid:[[:space:]]*\([0-9]*\).*/\1/p' "/proc/${of_l##*"$TAB"}/status" 2>/dev/null)
        case $of_u in '' | 0 | "$of_me" | "$(stat -c %u -- "${of_l%"$TAB"*}" 2>/dev/null)") say "$of_l" ;; esac
    done
}
open_holds() {
    (cd /proc && exec ls -ln /dev/null [0-9]*/fd) 2>/dev/null | grep -F -e '/fd:' -e " -> $DIR/" | {
        of_pid=
        while IFS= read -r of_l; do
            case $of_l in
                *' -> '*) [ -z "$of_pid" ] || [ "$of_pid" = $$ ] || printf '%s\t%s\n' "${of_l#*' -> '}" "$of_pid" ;;
                *[0-9]/fd:) of_pid=${of_l%/fd:} ;;
            esac
        done
    }
    (cd /proc && exec grep -F -e " $DIR/" /dev/null [0-9]*/maps) 2>/dev/null |
        while read -r of_a _ _ _ _ of_path; do
            case ${of_a%%/maps:*} in '' | *[!0-9]*) ;; *) printf '%s\t%s\n' "$of_path" "${of_a%%/maps:*}" ;; esac
        done
}
# delete_one PATH: delete PATH if, seen from inside its directory, that directory is still
# physically under DIR on DIR's device and mount, and PATH still a regular file not modified since
# REF. 0 deleted; 1 failed (rm's reason on stdout); 2 modified meanwhile; 3 gone or no regular
# file; 4 on another mount.
delete_one() {
    (
        cd -P "${1%/*}" 2>/dev/null || exit 3
        case $(pwd -P) in "$DIR" | "$DIR"/*) ;; *) exit 3 ;; esac
        [ "$(stat -c %d .)" = "$DEV" ] || exit 3
        [ -z "$MNT" ] || [ "$(mount_id)" = "$MNT" ] || exit 4
        do_base=./${1##*/}
        [ -f "$do_base" ] && [ ! -L "$do_base" ] || exit 3
        # rm, not -delete (busybox find may lack it); from here it can only unlink this name
        do_out=$(find "$do_base" -maxdepth 0 -type f ! -newer "$REF" -print -exec rm -f {} + 2>&1) ||
            { say "${do_out##*: }" && exit 1; }
        [ -n "$do_out" ] || exit 2
    )
}
# skipped PATH MESSAGE: report a skip or failure; the daemon logs one only when its last pass did not.
skipped() {
    SKIPPED=$SKIPPED$NL$1
    case $NL$PREV$NL in *"$NL$1$NL"*) [ "$ACTION" != loop ] || return 0 ;; esac
    note "$2"
}
# pass: one sweep of DIR; sets P_DELETED P_BYTES P_OPEN P_YOUNG P_FAILED.
pass() {
    P_DELETED=0 P_BYTES=0 P_OPEN=0 P_YOUNG=0 P_FAILED=0 PREV=$SKIPPED SKIPPED=
    if ! pa_list=$(candidates); then
        P_FAILED=1
        note "janitor: cannot read the mount table (/proc/self/mountinfo): deleting nothing"
        return 1
    fi
    [ -n "$pa_list" ] || return 0
    pa_open=$NL$(open_files)$NL
    pa_now=$(date +%s)
    if [ "$DRY_RUN" != 1 ]; then
        REF=$(mktemp "${STATE%/*}/.ref.XXXXXX") || { note "janitor: cannot create a temporary file" && P_FAILED=1 && return 1; }
        touch -d "@$((pa_now - MIN_AGE))" "$REF"
    fi
    while IFS= read -r pa_path; do # SIZE MTIME PATH: a path may end in a space
        case $pa_path in '! '*) skipped "$pa_path" "${pa_path#! }"; continue ;; esac
        pa_size=${pa_path%% *} pa_path=${pa_path#* }
        pa_mtime=${pa_path%% *} pa_path=${pa_path#* }
        case $pa_size$pa_mtime in '' | *[!0-9]*) continue ;; esac
        case $pa_path in "$DIR"/*) ;; *) continue ;; esac
        pa_age=$((pa_now - pa_mtime))
        # %Y drops mtime's fraction: at exactly MIN_AGE whole seconds the file may still be
        # younger than REF, so it waits one more pass; REF decides at deletion.
        if [ "$pa_age" -lt "$MIN_AGE" ] || { [ "$pa_age" -eq "$MIN_AGE" ] && [ "$MIN_AGE" -gt 0 ]; }; then
            P_YOUNG=$((P_YOUNG + 1))
            skipped "$pa_path" "skipped (modified ${pa_age}s ago): $pa_path"
            continue
        fi
        case $pa_open in
            *"$NL$pa_path$TAB"*)
                pa_pid=${pa_open#*"$NL$pa_path$TAB"}
                P_OPEN=$((P_OPEN + 1))
                skipped "$pa_path" "skipped (in use by pid ${pa_pid%%"$NL"*}): $pa_path"
                continue
                ;;
        esac
        pa_rc=0
        if [ "$DRY_RUN" = 1 ]; then say "would delete: $pa_path ($pa_size bytes)"; else pa_why=$(delete_one "$pa_path") || pa_rc=$?; fi
        case $pa_rc in
            0)
                P_DELETED=$((P_DELETED + 1)) P_BYTES=$((P_BYTES + pa_size))
                [ "$DRY_RUN" = 1 ] || note "deleted$SEP $pa_path ($pa_size bytes)"
                [ -z "$LOG_FILE" ] || say "$(date -u +%Y-%m-%dT%H:%M:%SZ) deleted $pa_path ($pa_size bytes) (run-once)" >>"$LOG_FILE"
                ;;
            1) P_FAILED=$((P_FAILED + 1)) && skipped "$pa_path" "failed to delete$SEP $pa_path ($pa_why)" ;;
            2) P_YOUNG=$((P_YOUNG + 1)) && skipped "$pa_path" "skipped (modified just now): $pa_path" ;;
            4) skipped "$pa_path" "skipped (on another mount, made since the pass began): $pa_path" ;;
        esac
    done <<EOF
$pa_list
EOF
    [ -z "$REF" ] || rm -f "$REF"
    REF=
}
# compared < CONFIG: what a second start must ask for as the running janitor has it
compared() { grep -e '^delete=' -e '^keep=' -e '^min_age=' | sort; }
start_janitor() {
    check_options
    command -v setsid >/dev/null 2>&1 || refuse "setsid (util-linux) is not installed on this host"
    [ -n "${JANITOR_LOOP:-}" ] || refuse "janitor-loop.sh's text is missing: run it through fleet (fleet janitor)"
    find_state
    umask 077
    mkdir -p "$STATE" || refuse "cannot create $STATE"
    lock
    if alive && uptime_of "$PID"; then # running with other globs or min-age: not what was asked
        run_cfg=$(compared <"$STATE/config")
        [ "$run_cfg" = "$(say "$CONFIG" | compared)" ] || refuse "already running" \
            "for $DIR with other globs or min-age (pid $PID: $(words "$run_cfg")): stop it first to change them"
        finish "janitor: already running for $DIR (pid $PID, up ${UPTIME}s)"
    fi
    rm -f "$STATE/pid" "$STATE/starttime"
    { put "$STATE/dir" "$DIR" && put "$STATE/config" "$CONFIG" && put "$STATE/stats" "deleted=0${NL}freed_bytes=0" &&
        put "$STATE/janitor-loop.sh" "$JANITOR_LOOP" && : >>"$STATE/log"; } || refuse "cannot write the janitor's state in $STATE"
    # setsid: its own session, no terminal; in / so it never holds a mount busy; no inherited fd
    # but the log (one on a file in DIR would pin it as in use). It writes its pid and start time.
    (unset JANITOR_LOOP && cd / && exec setsid sh "$STATE/janitor-loop.sh" loop --dir "$DIR" --state "$STATE" \
        </dev/null >>"$STATE/log" 2>&1 3<&- 4<&- 5<&- 6<&- 7<&- 8<&- 9<&-) &
    within 50 alive || { tail -n 5 "$STATE/log" 2>/dev/null; refuse "the janitor did not start for $DIR (see $STATE/log)"; }
    say "janitor: started for $DIR (pid $PID, every ${INTERVAL}s, files older than ${MIN_AGE}s," \
        "deleting $(words "$DELETES"), keeping $(words "${KEEPS:-none}"))"
}
# signal_janitor SIG: the janitor's process group (it leads one: setsid), else its pid.
signal_janitor() {
    if proc_stat "$PID" && [ "$PS_PGID" = "$PID" ] && kill -"$1" -"$PID" 2>/dev/null; then return 0; fi
    kill -"$1" "$PID" 2>/dev/null
}
stop_janitor() {
    find_state
    [ "$DIR_EXISTS" = 1 ] || [ -f "$STATE/dir" ] || finish "janitor: not running for $DIR (no such directory on this host)"
    [ ! -d "$STATE" ] || lock # a start in flight finishes first; its pid files are not ours
    alive || { rm -f "$STATE/pid" "$STATE/starttime" 2>/dev/null; finish "janitor: not running for $DIR"; }
    pid=$PID
    signal_janitor TERM
    within 50 dead || { signal_janitor KILL; within 50 dead; } || refuse "janitor pid $pid for $DIR survived SIGKILL"
    rm -f "$STATE/pid" "$STATE/starttime"
    say "janitor: stopped for $DIR (pid $pid; deleted $(files "$(stat_of deleted)"), freed $(human "$(stat_of freed_bytes)"))"
}
# janitor_status: a facts line for DIR's janitor, or without --dir for each of this node's
janitor_status() {
    find_state
    if [ "$DIR_GIVEN" = 1 ] && [ "$DIR_EXISTS" != 1 ] && [ ! -f "$STATE/dir" ]; then
        say "janitor=none dir=$DIR reason=no-such-directory" # `fleet status` before the first run
        return
    fi
    if [ "$DIR_GIVEN" = 1 ]; then set -- "$STATE"; else set -- "$BASE"/*; fi
    found=''
    for STATE; do
        [ "$DIR_GIVEN" = 1 ] || { [ -f "$STATE/dir" ] && DIR=$(cat "$STATE/dir"); } || continue
        found=1
        free=$(df -Pk "$DIR" 2>/dev/null | awk 'NR == 2 { printf "%.0f", $4 * 1024 }')
        tail="deleted=$(stat_of deleted) freed_bytes=$(stat_of freed_bytes) free_bytes=${free:-unknown}"
        if alive && uptime_of "$PID"; then
            say "janitor=running dir=$DIR pid=$PID uptime_s=$UPTIME $tail"
        elif [ -f "$STATE/pid" ]; then # ended with no stop: killed, crashed, DIR replaced, a reboot
            say "janitor=dead dir=$DIR $tail"
        else
            say "janitor=stopped dir=$DIR $tail"
        fi
    done
    [ -n "$found" ] || say "janitor=none"
}
run_once() {
    INTERVAL=1
    check_options
    find_state
    # deletions also go to the janitor's log when one was ever started for DIR
    [ "$DRY_RUN" = 1 ] || [ ! -f "$STATE/dir" ] || LOG_FILE=$STATE/log
    SEP=:
    pass
    skips=
    [ "$P_OPEN" -eq 0 ] || skips="$P_OPEN in use"
    [ "$P_YOUNG" -eq 0 ] || skips="${skips:+$skips, }$P_YOUNG modified in the last ${MIN_AGE}s"
    verb=deleted
    [ "$DRY_RUN" = 0 ] || verb="would delete"
    say "janitor: $verb $(files "$P_DELETED") ($P_BYTES bytes, $(human "$P_BYTES"))${skips:+; skipped $skips}"
    [ "$P_FAILED" -eq 0 ]
}

# leave REASON [died]: log it, end the sleep, drop the pid files if they still name this daemon,
# but not when it died on its own (its dir gone): status then says janitor=dead, not stopped
leave() {
    [ -z "$SLEEP_PID" ] || kill "$SLEEP_PID" 2>/dev/null
    [ -z "$REF" ] || rm -f "$REF"
    [ -n "${2:-}" ] || [ "$(cat "$STATE/pid" 2>/dev/null)" != $$ ] || rm -f "$STATE/pid" "$STATE/starttime"
    note "janitor stopped: $1 (deleted $TOTAL_DELETED files, $TOTAL_BYTES bytes in all)"
    exit 0
}
daemon() {
    [ -f "$STATE/config" ] || die_usage "loop needs --state, the janitor's state dir"
    while IFS= read -r l; do
        case $l in
            interval=*) INTERVAL=${l#*=} ;;
            min_age=*) MIN_AGE=${l#*=} ;;
            delete=*) DELETES=${DELETES:+$DELETES$NL}${l#*=} ;;
            keep=*) KEEPS=${KEEPS:+$KEEPS$NL}${l#*=} ;;
        esac
    done <"$STATE/config"
    case $INTERVAL in '' | *[!0-9.]* | *.*.* | .) die_usage "interval '$INTERVAL' in $STATE/config" ;; esac
    case $MIN_AGE in '' | *[!0-9]*) die_usage "min_age '$MIN_AGE' in $STATE/config" ;; esac
    trap 'leave "TERM received"' TERM
    trap 'leave "INT received"' INT
    trap '' HUP
    TOTAL_DELETED=$(stat_of deleted) TOTAL_BYTES=$(stat_of freed_bytes)
    case $TOTAL_DELETED$TOTAL_BYTES in '' | *[!0-9]*) TOTAL_DELETED=0 TOTAL_BYTES=0 ;; esac
    { proc_stat $$ && put "$STATE/starttime" "$PS_START" && put "$STATE/pid" $$; } || fail "janitor: cannot write $STATE/pid"
    id=$(stat -c '%d:%i' "$DIR" 2>/dev/null)
    note "janitor started: pid $$, dir $DIR, every ${INTERVAL}s, files older than ${MIN_AGE}s," \
        "deleting $(words "$DELETES"), keeping $(words "${KEEPS:-none}")"
    while :; do
        [ "$(stat -c '%d:%i' "$DIR" 2>/dev/null)" = "$id" ] || leave "$DIR is gone" died
        [ "$(cat "$STATE/pid" 2>/dev/null)" = $$ ] || leave "$STATE/pid no longer names this janitor"
        pass
        if [ "$P_DELETED" -gt 0 ]; then
            TOTAL_DELETED=$((TOTAL_DELETED + P_DELETED)) TOTAL_BYTES=$((TOTAL_BYTES + P_BYTES))
            put "$STATE/stats" "deleted=$TOTAL_DELETED${NL}freed_bytes=$TOTAL_BYTES"
            note "pass: deleted $(files "$P_DELETED") ($(human "$P_BYTES")); in all $TOTAL_DELETED files, $(human "$TOTAL_BYTES")"
        fi
        sleep "$INTERVAL" &
        SLEEP_PID=$!
        wait "$SLEEP_PID" 2>/dev/null # no "Terminated" in the log when stop ends the sleep
        SLEEP_PID=
    done
}

ACTION=${1:-}
[ -n "$ACTION" ] || die_usage "missing ACTION (start, stop, status, run-once)"
shift
DIR='' DIR_GIVEN=0 STATE='' INTERVAL=3 MIN_AGE=10 DELETES='' KEEPS='' DRY_RUN=0 ALLOW_WEIGHTS=0
LOG_FILE='' SEP='' REF='' SLEEP_PID='' SKIPPED='' CONFIG=
while [ $# -gt 0 ]; do
    case $1 in
        --dry-run) DRY_RUN=1 && shift && continue ;;
        --allow-weights) ALLOW_WEIGHTS=1 && shift && continue ;;
        --dir | --state | --interval | --min-age | --delete | --keep) [ $# -ge 2 ] || die_usage "$1 needs a value" ;;
        *) die_usage "unknown option '$1'" ;;
    esac
    case $1 in
        --dir) DIR=$2 DIR_GIVEN=1 ;;
        --state) STATE=$2 ;;
        --interval) INTERVAL=$2 ;;
        --min-age) MIN_AGE=$2 ;;
        --delete) DELETES=${DELETES:+$DELETES$NL}$2 ;;
        --keep) KEEPS=${KEEPS:+$KEEPS$NL}$2 ;;
    esac
    shift 2
done
case $ACTION in
    start | stop | status | run-once | loop) ;;
    *) die_usage "unknown action '$ACTION' (start, stop, status, run-once)" ;;
esac
[ "$DRY_RUN" = 0 ] || [ "$ACTION" = run-once ] || die_usage "--dry-run is for run-once only"
if [ "$DIR_GIVEN" = 1 ] || [ "$ACTION" != status ]; then resolve_dir "$DIR"; fi
case $ACTION in
    stop | status) ;;
    *) [ "$DIR_EXISTS" = 1 ] || refuse "no such directory on this host: $DIR (wrong host or typo?)" ;;
esac
DEV=$(stat -c %d "$DIR" 2>/dev/null) MNT=$(mount_id "$DIR")
case $ACTION in
    start) start_janitor ;;
    stop) stop_janitor ;;
    status) janitor_status ;;
    run-once) run_once ;;
    loop) daemon ;;
esac
