#!/bin/sh
# fleet/remote/janitor-loop.sh: the checkpoint janitor's engine: one pass, or the daemon loop.
#
# Not run by fleet directly: janitor.sh carries this text (`# fleet:include`), writes it to the
# janitor's state dir and starts it detached for `start`, or runs one pass of it for `run-once`.
#
#   sh janitor-loop.sh once --dir DIR --min-age S --delete GLOB... [--keep GLOB...] [--dry-run]
#                           [--log FILE]
#   sh janitor-loop.sh loop --dir DIR --state STATE --interval S --min-age S --delete GLOB...
#                           [--keep GLOB...]
#
# DIR arrives absolute and resolved (janitor.sh refused everything unsafe); it is checked again
# here all the same. A pass finds regular files under DIR (never following a symlink, never
# leaving DIR's filesystem, never entering a mount point: a bind mount of the same filesystem
# has DIR's device number, so -xdev alone would walk through it to files outside DIR) whose
# name matches a --delete glob and no --keep glob, then leaves alone those modified in the last
# --min-age seconds (still being written) and those any process holds open or mapped (deleting
# them would free nothing). Each file is deleted from inside its own directory after checking
# that directory is still physically under DIR, on DIR's filesystem and on DIR's mount, so a
# directory swapped for a symlink or a mount made mid-pass cannot redirect a deletion.
#
# The loop records its pid and start time in STATE (janitor.sh identifies it by both), writes
# cumulative counts to STATE/stats after each pass that deleted something, logs one timestamped
# line per deletion on stdout (janitor.sh points that at STATE/log), and exits by itself when DIR
# disappears or is replaced, or when STATE/pid no longer names it.
#
# Exit: 0 ok, 1 a deletion failed or DIR is unusable, 2 bad usage.

LC_ALL=C
export LC_ALL
NL='
'
TAB=$(printf '\t')

say() { printf '%s\n' "$*"; }
die_usage() { printf 'janitor-loop.sh: %s\n' "$*" >&2; exit 2; }
stamp() { date -u +%Y-%m-%dT%H:%M:%SZ; }
log() { printf '%s %s\n' "$(stamp)" "$*"; }

# human BYTES: 1.2 MB style (powers of 1000), exact below 1 kB.
human() {
    awk -v b="$1" 'BEGIN {
        n = split("kB MB GB TB PB EB", u, " ")
        if (b < 1000) { printf "%.0f B\n", b; exit }
        for (i = 1; i < n && b >= 999950; i++) b /= 1000
        printf "%.1f %s\n", b / 1000, u[i]
    }'
}

# start_time PID: field 22 of /proc/PID/stat (clock ticks since boot), read after comm's ')'.
start_time() {
    st_line=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    st_rest=${st_line##*) }
    # shellcheck disable=SC2086 # split the fields on purpose
    set -- $st_rest
    shift 19
    printf '%s\n' "$1"
}

# dir_id: DIR's device and inode, to notice DIR being removed and recreated.
dir_id() { stat -c '%d:%i' "$DIR" 2>/dev/null; }

# in_list LIST LINE: LINE is one of the newline-separated LIST's lines.
in_list() {
    case "$NL$1$NL" in *"$NL$2$NL"*) return 0 ;; esac
    return 1
}

# --------------------------------------------------------------- finding candidates

# mount_points: the mount points strictly under DIR, one per line, each escaped as a find -path
# pattern (\ * ? [ get a \), from this node's mount table: mountinfo's field 5, else
# /proc/mounts' field 2 (both octal-escape space, tab, newline and backslash). One with a
# newline is left out: every path below it has one too, and such paths are never candidates.
# Fails when there is no mount table to read: nothing may be deleted then.
mount_points() {
    if [ -r /proc/self/mountinfo ]; then
        set -- 5 /proc/self/mountinfo
    elif [ -r /proc/mounts ]; then
        set -- 2 /proc/mounts
    else
        return 1
    fi
    JANITOR_DIR=$DIR awk -v field="$1" '
        function unescape(s,    out, i, code) {
            out = ""
            while ((i = index(s, "\\")) > 0) {
                code = substr(s, i + 1, 3)
                out = out substr(s, 1, i - 1)
                if (code ~ /^[0-7][0-7][0-7]$/) {
                    out = out sprintf("%c", substr(code, 1, 1) * 64 + substr(code, 2, 1) * 8 + substr(code, 3, 1))
                    s = substr(s, i + 4)
                } else {
                    out = out "\\"
                    s = substr(s, i + 1)
                }
            }
            return out s
        }
        function pattern(s,    out, i, c) {
            out = ""
            for (i = 1; i <= length(s); i++) {
                c = substr(s, i, 1)
                if (index("\\*?[", c) > 0) out = out "\\"
                out = out c
            }
            return out
        }
        BEGIN { under = ENVIRON["JANITOR_DIR"] "/" }
        {
            p = unescape($field)
            if (index(p, under) == 1 && index(p, "\n") == 0) print pattern(p)
        }' "$2"
}

# mount_id [PATH]: the id of the mount that PATH (default: the current directory) is on, from
# /proc/self/fdinfo (Linux 3.15+); nothing on older kernels. A bind mount has an id of its
# own even when its device number is DIR's.
mount_id() { sed -n 's/^mnt_id:[[:space:]]*//p' /proc/self/fdinfo/3 3<"${1:-.}" 2>/dev/null; }

# candidates: "SIZE MTIME PATH" for each regular file under DIR whose name matches a --delete
# glob and no --keep glob. -P: symlinks are never followed (a symlink is not -type f, and a
# symlinked directory is not descended); -xdev: DIR's filesystem only; every mount point under
# DIR is pruned (neither entered nor listed). Paths with a newline are left alone (one path per
# line below). Fails, listing nothing, when the mount table cannot be read.
candidates() {
    cd_mounts=$(mount_points) || return 1
    set -- -P "$DIR" -xdev
    if [ -n "$cd_mounts" ]; then
        set -- "$@" "("
        cd_first=1
        while IFS= read -r cd_mount; do
            [ -n "$cd_first" ] || set -- "$@" -o
            cd_first=
            set -- "$@" -path "$cd_mount"
        done <<EOF
$cd_mounts
EOF
        set -- "$@" ")" -prune -o
    fi
    set -- "$@" ! -path "*$NL*" -type f "("
    cd_first=1
    while IFS= read -r cd_glob; do
        [ -n "$cd_glob" ] || continue
        [ -n "$cd_first" ] || set -- "$@" -o
        cd_first=
        set -- "$@" -name "$cd_glob"
    done <<EOF
$DELETES
EOF
    set -- "$@" ")"
    while IFS= read -r cd_glob; do
        [ -n "$cd_glob" ] || continue
        set -- "$@" ! -name "$cd_glob"
    done <<EOF
$KEEPS
EOF
    # an unreadable subdirectory makes find exit 1 after listing the rest: not a failed pass
    find "$@" -exec stat -c '%s %Y %n' {} +
    return 0
}

# open_files: "PATH<TAB>PID" for every file under DIR that a process holds open (fd) or has
# mapped. One ls over all of /proc (not a readlink per fd) and one grep over all maps.
open_files() {
    (cd /proc && exec ls -ln /dev/null [0-9]*/fd) 2>/dev/null |
        grep -F -e '/fd:' -e " -> $DIR/" | {
        of_pid=
        while IFS= read -r of_line; do
            case $of_line in
                *' -> '*)
                    # not this shell: an fd it inherited would otherwise pin the file for good
                    [ -n "$of_pid" ] && [ "$of_pid" != $$ ] &&
                        printf '%s\t%s\n' "${of_line#*' -> '}" "$of_pid"
                    ;;
                *[0-9]/fd:) of_pid=${of_line%/fd:} ;;
            esac
        done
    }
    (cd /proc && exec grep -F -e " $DIR/" /dev/null [0-9]*/maps) 2>/dev/null |
        while read -r of_a _ _ _ _ of_path; do
            of_pid=${of_a%%/maps:*}
            case $of_pid in '' | *[!0-9]*) continue ;; esac
            printf '%s\t%s\n' "$of_path" "$of_pid"
        done
}

# --------------------------------------------------------------- deleting

# delete_one PATH: delete PATH if, checked from inside its directory, that directory is still
# physically under DIR on DIR's filesystem and mount and PATH is still a regular file not
# modified since REF. 0 deleted; 1 failed (find said why on stderr); 2 modified meanwhile; 3 gone
# or no longer a regular file; 4 on another mount (one made under DIR since the pass began).
delete_one() {
    (
        cd -P "${1%/*}" 2>/dev/null || exit 3
        case $(pwd -P) in "$DIR" | "$DIR"/*) ;; *) exit 3 ;; esac
        [ "$(stat -c %d .)" = "$DEV" ] || exit 3
        [ -z "$MNT" ] || [ "$(mount_id)" = "$MNT" ] || exit 4
        do_base=./${1##*/}
        [ -f "$do_base" ] && [ ! -L "$do_base" ] || exit 3
        # rm, not -delete (busybox find may lack it); from here it can only unlink this name
        do_out=$(find "$do_base" -maxdepth 0 -type f ! -newer "$REF" -print -exec rm -f {} +) || exit 1
        [ -n "$do_out" ] || exit 2
    )
}

# --------------------------------------------------------------- one pass

# pass: one sweep of DIR. Sets P_DELETED P_BYTES P_OPEN P_YOUNG P_FAILED; in the loop,
# SKIPPED (newline-separated paths skipped this pass) so each skip is logged once.
pass() {
    P_DELETED=0 P_BYTES=0 P_OPEN=0 P_YOUNG=0 P_FAILED=0
    pa_prev=$SKIPPED
    SKIPPED=
    if ! pa_list=$(candidates); then
        P_FAILED=1
        pa_why="cannot read the mount table (/proc/self/mountinfo): deleting nothing"
        if [ "$MODE" = loop ]; then log "$pa_why"; else say "janitor: $pa_why"; fi
        return 1
    fi
    [ -n "$pa_list" ] || return 0
    pa_open=$NL$(open_files)$NL
    pa_now=$(date +%s)
    REF=
    if [ "$DRY_RUN" != 1 ]; then
        REF=$(mktemp "${TMPDIR:-/tmp}/fleet-janitor-ref.XXXXXX") || { say "janitor: cannot create a temporary file"; P_FAILED=1; return 1; }
        touch -d "@$((pa_now - MIN_AGE))" "$REF"
    fi
    while IFS= read -r pa_line; do
        pa_size=${pa_line%% *}
        pa_rest=${pa_line#* }
        pa_mtime=${pa_rest%% *}
        pa_path=${pa_rest#* }
        case $pa_size$pa_mtime in '' | *[!0-9]*) continue ;; esac
        case $pa_path in "$DIR"/*) ;; *) continue ;; esac
        pa_age=$((pa_now - pa_mtime))
        # %Y drops mtime's fraction: at exactly MIN_AGE whole seconds the file may still be
        # younger than REF (now - MIN_AGE), so wait one more pass; REF decides at deletion.
        if [ "$pa_age" -lt "$MIN_AGE" ] || { [ "$pa_age" -eq "$MIN_AGE" ] && [ "$MIN_AGE" -gt 0 ]; }; then
            P_YOUNG=$((P_YOUNG + 1))
            skipped "$pa_path" "skipped (modified ${pa_age}s ago): $pa_path" "$pa_prev"
            continue
        fi
        case $pa_open in
            *"$NL$pa_path$TAB"*)
                pa_pid=${pa_open#*"$NL$pa_path$TAB"}
                pa_pid=${pa_pid%%"$NL"*}
                P_OPEN=$((P_OPEN + 1))
                skipped "$pa_path" "skipped (in use by pid $pa_pid): $pa_path" "$pa_prev"
                continue
                ;;
        esac
        if [ "$DRY_RUN" = 1 ]; then
            say "would delete: $pa_path ($pa_size bytes)"
            P_DELETED=$((P_DELETED + 1))
            P_BYTES=$((P_BYTES + pa_size))
            continue
        fi
        delete_one "$pa_path"
        case $? in
            0)
                P_DELETED=$((P_DELETED + 1))
                P_BYTES=$((P_BYTES + pa_size))
                if [ "$MODE" = loop ]; then
                    log "deleted $pa_path ($pa_size bytes)"
                else
                    say "deleted: $pa_path ($pa_size bytes)"
                    [ -z "$LOG_FILE" ] || log "deleted $pa_path ($pa_size bytes) (run-once)" >>"$LOG_FILE"
                fi
                ;;
            1)
                P_FAILED=$((P_FAILED + 1))
                if [ "$MODE" = loop ]; then log "failed to delete $pa_path"; else say "failed to delete: $pa_path"; fi
                ;;
            2)
                P_YOUNG=$((P_YOUNG + 1))
                skipped "$pa_path" "skipped (modified just now): $pa_path" "$pa_prev"
                ;;
            4) skipped "$pa_path" "skipped (on another mount, made since the pass began): $pa_path" "$pa_prev" ;;
        esac
    done <<EOF
$pa_list
EOF
    [ -z "$REF" ] || rm -f "$REF"
    REF=
}

# skipped PATH MESSAGE PREVIOUS: report a skip; the loop logs it only the first time in a row.
skipped() {
    if [ "$MODE" = loop ]; then
        SKIPPED=$SKIPPED$NL$1
        in_list "$3" "$1" || log "$2"
    else
        say "$2"
    fi
}

# skip_summary: "; skipped N in use, M modified in the last Ss" or nothing.
skip_summary() {
    ss=
    [ "$P_OPEN" -eq 0 ] || ss="$P_OPEN in use"
    if [ "$P_YOUNG" -gt 0 ]; then
        ss="${ss:+$ss, }$P_YOUNG modified in the last ${MIN_AGE}s"
    fi
    [ -z "$ss" ] || printf '; skipped %s' "$ss"
}

# words LIST: a newline-separated list on one line, space-separated.
words() { printf '%s\n' "$1" | paste -s -d ' ' -; }

plural_files() { if [ "$1" -eq 1 ]; then printf '1 file'; else printf '%s files' "$1"; fi; }

run_once() {
    SKIPPED=
    pass
    if [ "$DRY_RUN" = 1 ]; then
        say "janitor: would delete $(plural_files "$P_DELETED") ($P_BYTES bytes, $(human "$P_BYTES"))$(skip_summary)"
    else
        say "janitor: deleted $(plural_files "$P_DELETED") ($P_BYTES bytes, $(human "$P_BYTES"))$(skip_summary)"
    fi
    [ "$P_FAILED" -eq 0 ]
}

# --------------------------------------------------------------- the daemon

write_file() { printf '%s\n' "$2" >"$1.tmp.$$" && mv -f "$1.tmp.$$" "$1"; }

# leave REASON: log why, drop the pid files if they still name us, end the sleep, exit 0.
leave() {
    [ -z "$SLEEP_PID" ] || kill "$SLEEP_PID" 2>/dev/null
    [ -z "$REF" ] || rm -f "$REF"
    if [ "$(cat "$STATE/pid" 2>/dev/null)" = "$$" ]; then
        rm -f "$STATE/pid" "$STATE/starttime"
    fi
    log "janitor stopped: $1 (deleted $TOTAL_DELETED files, $TOTAL_BYTES bytes in all)"
    exit 0
}

loop() {
    SLEEP_PID=
    REF=
    cd / || exit 1
    trap 'leave "TERM received"' TERM
    trap 'leave "INT received"' INT
    trap '' HUP
    TOTAL_DELETED=$(sed -n 's/^deleted=//p' "$STATE/stats" 2>/dev/null)
    TOTAL_BYTES=$(sed -n 's/^freed_bytes=//p' "$STATE/stats" 2>/dev/null)
    case ${TOTAL_DELETED:-x}${TOTAL_BYTES:-x} in *[!0-9]*) TOTAL_DELETED=0 TOTAL_BYTES=0 ;; esac
    me=$(start_time $$) || { say "janitor: cannot read /proc/$$/stat"; exit 1; }
    if ! { write_file "$STATE/starttime" "$me" && write_file "$STATE/pid" "$$"; }; then
        say "janitor: cannot write $STATE/pid"
        exit 1
    fi
    id=$(dir_id)
    log "janitor started: pid $$, dir $DIR, every ${INTERVAL}s, files older than ${MIN_AGE}s," \
        "deleting $(words "$DELETES"), keeping $(words "${KEEPS:-none}")"
    SKIPPED=
    while :; do
        if [ ! -d "$DIR" ] || [ "$(dir_id)" != "$id" ]; then leave "$DIR is gone"; fi
        [ "$(cat "$STATE/pid" 2>/dev/null)" = "$$" ] || leave "$STATE/pid no longer names this janitor"
        pass
        if [ "$P_DELETED" -gt 0 ]; then
            TOTAL_DELETED=$((TOTAL_DELETED + P_DELETED))
            TOTAL_BYTES=$((TOTAL_BYTES + P_BYTES))
            write_file "$STATE/stats" "deleted=$TOTAL_DELETED${NL}freed_bytes=$TOTAL_BYTES"
            log "pass: deleted $(plural_files "$P_DELETED") ($(human "$P_BYTES")); in all $TOTAL_DELETED files, $(human "$TOTAL_BYTES")"
        fi
        sleep "$INTERVAL" &
        SLEEP_PID=$!
        wait "$SLEEP_PID" 2>/dev/null # no "Terminated" in the log when stop ends the sleep
        SLEEP_PID=
    done
}

# --------------------------------------------------------------- arguments

MODE=${1:-}
[ $# -gt 0 ] && shift
DIR=
STATE=
INTERVAL=3
MIN_AGE=
DELETES=
KEEPS=
DRY_RUN=0
LOG_FILE=
while [ $# -gt 0 ]; do
    case $1 in
        --dir) [ $# -ge 2 ] || die_usage "--dir needs a value"; DIR=$2; shift 2 ;;
        --state) [ $# -ge 2 ] || die_usage "--state needs a value"; STATE=$2; shift 2 ;;
        --interval) [ $# -ge 2 ] || die_usage "--interval needs seconds"; INTERVAL=$2; shift 2 ;;
        --min-age) [ $# -ge 2 ] || die_usage "--min-age needs seconds"; MIN_AGE=$2; shift 2 ;;
        --delete) [ $# -ge 2 ] || die_usage "--delete needs a glob"; DELETES=${DELETES:+$DELETES$NL}$2; shift 2 ;;
        --keep) [ $# -ge 2 ] || die_usage "--keep needs a glob"; KEEPS=${KEEPS:+$KEEPS$NL}$2; shift 2 ;;
        --log) [ $# -ge 2 ] || die_usage "--log needs a file"; LOG_FILE=$2; shift 2 ;;
        --dry-run) DRY_RUN=1; shift ;;
        *) die_usage "unknown option '$1'" ;;
    esac
done
case $DIR in
    /?*) ;;
    *) die_usage "--dir must be an absolute directory other than /, got '$DIR'" ;;
esac
[ -d "$DIR" ] || { say "janitor: no such directory on this host: $DIR"; exit 1; }
[ "$(cd -P "$DIR" && pwd -P)" = "$DIR" ] || die_usage "--dir must be given resolved (no symlink, no trailing /)"
case $MIN_AGE in '' | *[!0-9]*) die_usage "--min-age must be whole seconds" ;; esac
[ -n "$DELETES" ] || die_usage "at least one --delete glob is needed"
DEV=$(stat -c %d "$DIR") || exit 1
MNT=$(mount_id "$DIR")

case $MODE in
    once) run_once ;;
    loop)
        [ -d "${STATE:-/nonexistent}" ] || die_usage "loop needs --state DIR"
        case $INTERVAL in '' | *[!0-9.]* | *.*.* | .) die_usage "--interval must be seconds" ;; esac
        loop
        ;;
    *) die_usage "unknown mode '$MODE' (once, loop)" ;;
esac
