#!/bin/sh
# fleet/remote/cleanup.sh: node-side cleanup helper that fleet ships to every node.
#
# fleet runs it over SSH with the script on stdin, maybe under sudo and a deadline:
#
#     [timeout N] [sudo -n] sh -s -- ACTION [OPTIONS] < cleanup.sh
#
# Actions (every action prints human-readable lines; the LAST line is a one-line
# summary for fleet's live table; exit 0 = ok, 1 = something left or failed,
# 2 = bad usage, with the reason on stderr):
#
#   kill --pattern ERE [--pattern ERE ...] [--grace SECONDS] [--kill-gpu-holders]
#   gpu-reset
#   state --path GLOB [--path GLOB ...] [--allow-any-path]
#   port --port N [--grace SECONDS]
#   verify [--pattern ERE ...] [--port N ...] [--path GLOB ...] [--gpu-holders]
#   list --pattern ERE [--pattern ERE ...]
#   all --pattern ERE [...] [--grace S] [--kill-gpu-holders] --port N --path GLOB [...]
#       [--allow-any-path]
#
# state (and all) remove only where training state lives: below /tmp, /var/tmp, /dev/shm and
# the login home's ~/.cache, and the login home's ~/.nv and ~/.triton (see "where state may be
# removed" below). A --path elsewhere is refused before anything runs (exit 1, one line per
# path); a match that resolves elsewhere through a symlinked directory is refused before
# anything is removed. --allow-any-path lifts both (never the refusal of / and the homes).
#
# `list` changes nothing: one `proc PID CMD` line per process that `kill` would end
# (same matching and exclusions), then `training=N pids=P1,P2,...` for `fleet status`.
#
# Why we never `pkill -f` (PITFALLS 1): the patterns we are asked to kill
# (`torchrun`, `train\.py`) are in our own argv, in the argv of the `sh -c '...'`
# that sshd started for us and in sudo's argv. `pkill -f torchrun` run this way
# kills its own caller: the SSH command dies before it prints anything and
# `|| true` never runs. So we enumerate /proc ourselves and leave alone:
#   - pid 1, kernel threads and zombies;
#   - ourselves ($$) and everything we started;
#   - all our ancestors up to pid 1 (sh -c, sudo, timeout, sshd), which may sit in
#     other sessions (sudo with use_pty starts a new one);
#   - every process of our own session: whatever fleet's command line started
#     next to us (pipelines, wrappers) carries the same patterns. The session only
#     counts as ours when its leader is us or one of our ancestors (and not pid 1):
#     in a container or PID namespace the leader is often invisible (sid 0) or
#     is init, and such a "session" also holds the training job we must kill.
# Then we kill by PID: TERM first (torchrun forwards it to its workers and they
# release the GPU cleanly), KILL after a grace period, and report (PITFALLS 2).
# Identity is pid + start time, so a pid the kernel recycles is never signalled.
#
# Portability: POSIX sh (dash, busybox ash, bash) with coreutils-level tools
# (tr, ls, grep, sort, rm, sleep, cat, dd, optional timeout); no ps, pgrep, fuser or ss.
# The script is read from stdin, so main() points stdin at /dev/null before any
# child runs: a child reading stdin would otherwise eat the rest of the script.
# Speed: a shell's `read` takes one byte per system call, and each read of a /proc
# file formats it anew; on a node with a thousand processes, reading every
# /proc/PID/stat that way cost seconds of CPU per scan. Bulk data is read with one
# command into a variable (command substitution reads in blocks) and split in the
# shell; `read` is left to short, already filtered input.

LC_ALL=C
export LC_ALL
NL='
'
IFS=' 	
'
DEFAULT_IFS=$IFS
SELF=$$
KILL_WAIT_DS=50   # deciseconds to wait for SIGKILL to take effect
# Poll times while waiting for processes to end, in centiseconds since the wait began:
# most end within milliseconds of TERM, so the first polls come fast; then every 0.2 s.
POLL_CS='2 5 10 20'
POLL_CS_LAST=20

usage() {
    cat <<'EOF'
usage: sh -s -- ACTION [OPTIONS] < cleanup.sh
  kill --pattern ERE [--pattern ERE ...] [--grace SECONDS] [--kill-gpu-holders]
  gpu-reset
  state --path GLOB [--path GLOB ...] [--allow-any-path]
  port --port N [--grace SECONDS]
  verify [--pattern ERE ...] [--port N ...] [--path GLOB ...] [--gpu-holders]
  list --pattern ERE [--pattern ERE ...]
  all --pattern ERE [...] [--grace S] [--kill-gpu-holders] --port N --path GLOB [...]
      [--allow-any-path]
EOF
}

die_usage() {
    printf 'cleanup.sh: %s\n' "$1" >&2
    usage >&2
    exit 2
}

say() {
    printf '%s\n' "$*"
}

# in_list LIST WORD: true if WORD is one of the space-separated words of LIST.
in_list() {
    case " $1 " in *" $2 "*) return 0 ;; esac
    return 1
}

# sort_pids LIST: SORTED = LIST sorted numerically, duplicates dropped.
# Short lists (the usual case) are sorted in the shell: no sort and tr per call.
sort_pids() {
    # shellcheck disable=SC2086  # LIST is pids: word splitting wanted
    set -- $1
    if [ "$#" -gt 32 ]; then
        SORTED=$(printf '%s\n' "$@" | sort -n -u | tr '\n' ' ')
        SORTED=${SORTED% }
        return 0
    fi
    SORTED=''
    for so_pid in "$@"; do
        so_head='' so_rest=$SORTED so_done=''
        while [ -n "$so_rest" ]; do
            so_first=${so_rest%% *}
            if [ "$so_first" = "$so_rest" ]; then so_rest=''; else so_rest=${so_rest#* }; fi
            if [ -z "$so_done" ] && [ "$so_pid" -le "$so_first" ]; then
                [ "$so_pid" -eq "$so_first" ] || so_head="$so_head $so_pid"
                so_done=1
            fi
            so_head="$so_head $so_first"
        done
        [ -n "$so_done" ] || so_head="$so_head $so_pid"
        SORTED=${so_head# }
    done
}

# plural N WORD: "1 process", "2 processes", "3 paths".
plural() {
    case $1:$2 in
    1:*) printf '%s %s' "$1" "$2" ;;
    *:process) printf '%s processes' "$1" ;;
    *) printf '%s %ss' "$1" "$2" ;;
    esac
}

# ---------------------------------------------------------------- processes

# proc_stat PID: parse /proc/PID/stat into PS_STATE PS_PPID PS_SID PS_FLAGS
# PS_START PS_COMM; false if the process is gone. Every line of it: a newline in comm
# splits the entry.
proc_stat() {
    PS_LINE=
    {
        {
            IFS= read -r PS_LINE
            while IFS= read -r ps_more; do
                PS_LINE="$PS_LINE$NL$ps_more"
            done
        } <"/proc/$1/stat"
    } 2>/dev/null
    parse_stat "$PS_LINE"
}

# parse_stat LINE: parse a /proc/PID/stat line into the PS_* variables. Field 2 is
# "(comm)" and comm may hold spaces and parentheses, so fields are split only after
# the last ") ".
parse_stat() {
    case $1 in *') '*) ;; *) return 1 ;; esac
    PS_COMM=${1#*\(}
    PS_COMM=${PS_COMM%\)*}
    # shellcheck disable=SC2086  # numeric fields: word splitting wanted
    set -- ${1##*') '}
    [ "$#" -ge 20 ] || return 1
    # shellcheck disable=SC2034  # PS_PPID, PS_SID: read by scan_one through eval
    PS_STATE=$1 PS_PPID=$2 PS_SID=$4 PS_FLAGS=$7 PS_START=${20}
}

# proc_alive PID START: the same process (pid and start time) still exists and
# is not a zombie.
proc_alive() {
    proc_stat "$1" || return 1
    case $PS_STATE in Z | X | x) return 1 ;; esac
    [ "$PS_START" = "$2" ]
}

# scan_procs: PIDS = every live user-space process (no kernel thread, no zombie),
# with PP_<pid> (parent), SID_<pid> (session) and ST_<pid> (start time). One cat
# reads every /proc/PID/stat. A comm holding a newline (any process may name itself
# so) splits its entry over lines, and a fragment could pass for another pid's entry:
# after a line that does not parse, every line up to and including the next one that
# does is dropped, and the pids left unseen are read one file at a time.
scan_procs() {
    PIDS=
    SCAN=$((${SCAN:-0} + 1))
    sp_all=$(cd /proc && exec cat [0-9]*/stat 2>/dev/null)
    sp_split=''
    IFS=$NL
    set -f
    for sp_line in $sp_all; do
        IFS=$DEFAULT_IFS
        if ! parse_stat "$sp_line"; then
            sp_split=1
            continue
        fi
        if [ -n "$sp_split" ]; then
            sp_split=''
            continue
        fi
        sp_pid=${sp_line%% *}
        case $sp_pid in '' | *[!0-9]*) continue ;; esac
        scan_one "$sp_pid"
    done
    set +f
    IFS=$DEFAULT_IFS
    for sp_dir in /proc/[0-9]*; do
        sp_pid=${sp_dir#/proc/}
        case $sp_pid in '' | *[!0-9]*) continue ;; esac
        sp_seen=''
        eval "sp_seen=\${SEEN_$sp_pid-}"
        [ "$sp_seen" = "$SCAN" ] && continue
        proc_stat "$sp_pid" && scan_one "$sp_pid" # vanished while scanning: skipped
    done
}

# scan_one PID: record PID (parsed into PS_*) for scan_procs, unless it is a kernel
# thread or a zombie.
scan_one() {
    eval "SEEN_$1=\$SCAN"
    case $PS_STATE in Z | X | x) return 0 ;; esac
    [ $((PS_FLAGS & 2097152)) -eq 0 ] || return 0 # PF_KTHREAD
    eval "PP_$1=\$PS_PPID SID_$1=\$PS_SID ST_$1=\$PS_START"
    PIDS="$PIDS $1"
}

# load_cmds LIST: read the command lines of every pid of LIST into CL_<pid> (NULs and
# newlines as spaces, trailing ones dropped; empty if none), with one grep over all
# of them instead of a tr per process (a GPU node runs hundreds). grep -H names the file
# on every line, so a pid is never paired with another's command line, and an argument
# holding a newline (two lines, same name) is joined back with a space.
load_cmds() {
    lc_list=$1
    set --
    for lc_pid in $lc_list; do
        set -- "$@" "/proc/$lc_pid/cmdline"
        eval "CL_$lc_pid="
    done
    [ "$#" -gt 0 ] || return 0
    if [ -z "${GREP_TEXT+set}" ]; then
        # GNU grep says "binary file matches" for NUL-separated text unless -a; busybox grep
        # has no -a (and no binary detection either).
        GREP_TEXT=-a
        printf 'x\n' | grep -a -e x >/dev/null 2>&1 || GREP_TEXT=
    fi
    # /dev/null as an extra operand: file names are printed even for a single pid.
    # shellcheck disable=SC2086  # GREP_TEXT: empty or one option
    lc_out=$(grep -H $GREP_TEXT -e '' /dev/null "$@" 2>/dev/null | tr '\000' ' ')
    IFS=$NL
    set -f
    for lc_l in $lc_out; do
        lc_pid=${lc_l#/proc/}
        lc_pid=${lc_pid%%/*}
        case $lc_pid in '' | *[!0-9]*) continue ;; esac
        lc_text=${lc_l#"/proc/$lc_pid/cmdline:"}
        eval "lc_prev=\$CL_$lc_pid"
        eval "CL_$lc_pid=\${lc_prev:+\$lc_prev }\$lc_text"
    done
    set +f
    IFS=$DEFAULT_IFS
    for lc_pid in $lc_list; do
        eval "lc_text=\$CL_$lc_pid"
        lc_text=${lc_text%"${lc_text##*[! ]}"}
        eval "CL_$lc_pid=\$lc_text"
    done
}

# load_cmd PID: CMDLINE = PID's command line for reports, from CL_<pid> if already read
# (so it survives the process); "[comm]" when it has none.
load_cmd() {
    eval "[ -n \"\${CL_$1+set}\" ]" || load_cmds "$1"
    eval "CMDLINE=\$CL_$1"
    if [ -z "$CMDLINE" ] && proc_stat "$1"; then
        CMDLINE="[$PS_COMM]"
        eval "CL_$1=\$CMDLINE"
    fi
}

# short_cmd PID: SHORT = PID's command line cut to 60 characters, for summaries.
short_cmd() {
    load_cmd "$1"
    SHORT=$(printf '%.60s' "$CMDLINE")
    [ "${#CMDLINE}" -le 60 ] || SHORT="$SHORT..."
}

# say_proc PREFIX PID [SUFFIX]: print PREFIX, PID's command line cut to 120
# characters, SUFFIX.
say_proc() {
    load_cmd "$2"
    sp_more=
    [ "${#CMDLINE}" -le 120 ] || sp_more=...
    printf '%s%.120s%s%s\n' "$1" "$CMDLINE" "$sp_more" "${3:-}"
}

# descendants_of LIST: CLOSURE = " LIST and all their descendants " among PIDS.
descendants_of() {
    CLOSURE=" $1 "
    case $1 in *[0-9]*) ;; *) return 0 ;; esac
    do_more=1
    while [ "$do_more" = 1 ]; do
        do_more=0
        for do_pid in $PIDS; do
            case $CLOSURE in *" $do_pid "*) continue ;; esac
            eval "do_parent=\${PP_$do_pid-}"
            [ -n "$do_parent" ] || continue
            case $CLOSURE in *" $do_parent "*)
                CLOSURE="$CLOSURE$do_pid "
                do_more=1
                ;;
            esac
        done
    done
}

# build_exclusions: EXCLUDED = the processes we must never signal (see header).
# Ancestors and our session come from scan_procs' PP_ and SID_ (every live process
# is in it, ourselves and our ancestors included).
build_exclusions() {
    be_pid=$SELF be_ancestors='' be_hops=0
    while :; do
        be_parent=''
        eval "be_parent=\${PP_$be_pid-}"
        case $be_parent in '' | 0 | 1) break ;; esac
        [ "$be_hops" -lt 4096 ] || break
        be_ancestors="$be_ancestors $be_parent"
        be_pid=$be_parent be_hops=$((be_hops + 1))
    done
    OUR_SID=
    be_sid=''
    eval "be_sid=\${SID_$SELF-}"
    if [ -n "$be_sid" ] && [ "$be_sid" -gt 1 ] && in_list "$SELF $be_ancestors" "$be_sid"; then
        OUR_SID=$be_sid
    fi
    descendants_of "$SELF"
    EXCLUDED=" 1 $SELF $be_ancestors $CLOSURE "
    if [ -n "$OUR_SID" ]; then
        for be_pid in $PIDS; do
            be_sid=''
            eval "be_sid=\${SID_$be_pid-}"
            [ "$be_sid" != "$OUR_SID" ] || EXCLUDED="$EXCLUDED$be_pid "
        done
    fi
}

is_excluded() {
    case $EXCLUDED in *" $1 "*) return 0 ;; esac
    return 1
}

# without_excluded LIST: KEPT = LIST minus EXCLUDED.
without_excluded() {
    KEPT=
    for we_pid in $1; do
        is_excluded "$we_pid" || KEPT="$KEPT $we_pid"
    done
}

# grep_patterns GREP-OPTION...: grep -E stdin with every --pattern.
grep_patterns() {
    set -f
    IFS=$NL
    for gp_pat in $PATTERNS; do
        set -- "$@" -e "$gp_pat"
    done
    IFS=$DEFAULT_IFS
    set +f
    grep -E "$@"
}

# match_patterns: MATCHED = non-excluded processes whose command line matches a
# --pattern, plus all their descendants (workers may be renamed: PITFALLS 2).
match_patterns() {
    mp_cands=
    for mp_pid in $PIDS; do
        is_excluded "$mp_pid" || mp_cands="$mp_cands $mp_pid"
    done
    # Read afresh (a worker may have renamed itself since), one per line in mp_cands
    # order; grep -n says which lines matched. A process without a command line, or one
    # that ended in between, gives an empty line, which no pattern matches (check_patterns
    # refuses patterns that match "").
    load_cmds "$mp_cands"
    mp_out=$(
        for mp_pid in $mp_cands; do
            eval "printf '%s\n' \"\$CL_$mp_pid\""
        done | grep_patterns -n
    )
    mp_lines=' '
    IFS=$NL
    set -f
    for mp_l in $mp_out; do
        mp_lines="$mp_lines${mp_l%%:*} "
    done
    set +f
    IFS=$DEFAULT_IFS
    mp_hits='' mp_line=0 mp_helpers=''
    for mp_pid in $mp_cands; do
        mp_line=$((mp_line + 1))
        in_list "$mp_lines" "$mp_line" || continue
        mp_cmd=''
        eval "mp_cmd=\$CL_$mp_pid"
        if is_helper "$mp_cmd"; then
            mp_helpers="$mp_helpers $mp_pid"
        else
            mp_hits="$mp_hits $mp_pid"
        fi
    done
    # Another fleet run's helper on this node (a second operator's cleanup, a status, a
    # kill-docker) carries the patterns in its argv too, and so do its children (grep -e
    # torchrun): it and everything under it are left alone, as our own session is.
    if [ -n "$mp_helpers" ]; then
        descendants_of "$mp_helpers"
        EXCLUDED="$EXCLUDED${CLOSURE# }"
    fi
    descendants_of "$mp_hits"
    without_excluded "$CLOSURE"
    MATCHED=$KEPT
}

# is_helper CMDLINE: the command line of fleet's cleanup helper (this script, also run
# by kill-docker and status: `sh -s -- ACTION ...` with one of its actions) or of a
# wrapper fleet starts it with (timeout, sudo, sh -c, docker exec). Only these actions:
# a user's own playbook may well start training from a script step (`sh -s -- torchrun
# ...`), and that must stay killable with everything under it.
is_helper() {
    ih_arg0=${1%% *}
    ih_rest="${1#"$ih_arg0"} "
    case ${ih_arg0##*/} in
    sh | dash | bash | ash | busybox | timeout | sudo | docker) ;;
    *) return 1 ;;
    esac
    for ih_action in kill all verify list port state gpu-reset; do
        case $ih_rest in
        " -s -- $ih_action "* | *" sh -s -- $ih_action "* | *"/sh -s -- $ih_action "*)
            return 0
            ;;
        esac
    done
    return 1
}

# ------------------------------------------------------------ open files

# fd_links [--cwd] STRING...: print "PID TARGET" for every open fd (and with
# --cwd every working directory) whose link target contains one of STRINGs.
# One ls over all of /proc instead of a readlink per fd.
fd_links() {
    fl_cwd=
    if [ "$1" = --cwd ]; then
        fl_cwd=1
        shift
    fi
    fl_n=$#
    while [ "$fl_n" -gt 0 ]; do
        set -- "$@" -e " -> $1"
        shift
        fl_n=$((fl_n - 1))
    done
    # /dev/null as an extra operand makes ls print a "PID/fd:" header even when
    # there is only one process directory.
    fl_out=$(
        (
            cd /proc || exit 0
            if [ -n "$fl_cwd" ]; then
                exec ls -ln /dev/null [0-9]*/cwd [0-9]*/fd
            fi
            exec ls -ln /dev/null [0-9]*/fd
        ) 2>/dev/null | grep -F -e '/fd:' "$@"
    )
    fl_cur=
    IFS=$NL
    set -f
    for fl_l in $fl_out; do
        case $fl_l in
        *' -> '*)
            fl_left=${fl_l%%' -> '*}
            case $fl_left in
            */cwd)
                fl_pid=${fl_left##* }
                fl_pid=${fl_pid%/cwd}
                ;;
            *) fl_pid=$fl_cur ;;
            esac
            case $fl_pid in '' | *[!0-9]*) continue ;; esac
            printf '%s %s\n' "$fl_pid" "${fl_l#*' -> '}"
            ;;
        *[0-9]/fd:) fl_cur=${fl_l%/fd:} ;;
        esac
    done
    set +f
    IFS=$DEFAULT_IFS
}

# map_links STRING...: print "PID PATH" for every memory mapping whose path
# contains one of STRINGs (/dev/shm segments are usually mmapped, not open).
map_links() {
    ml_n=$#
    while [ "$ml_n" -gt 0 ]; do
        set -- "$@" -e "$1"
        shift
        ml_n=$((ml_n - 1))
    done
    (cd /proc && exec grep -F "$@" /dev/null [0-9]*/maps) 2>/dev/null |
        while read -r ml_a _ _ _ _ ml_path; do
            ml_pid=${ml_a%%/maps:*}
            case $ml_pid in '' | *[!0-9]*) continue ;; esac
            printf '%s %s\n' "$ml_pid" "$ml_path"
        done
}

have_gpu_devices() {
    for hg_dev in /dev/nvidiactl /dev/nvidia[0-9]*; do
        [ -e "$hg_dev" ] && return 0
    done
    return 1
}

# gpu_holders: GPU_HOLDERS = pids with an fd open on /dev/nvidia[0-9]* or
# /dev/nvidiactl (what orphaned, possibly renamed workers still hold).
gpu_holders() {
    GPU_HOLDERS=
    have_gpu_devices || return 0
    gh_hits=$(fd_links /dev/nvidia)
    while read -r gh_pid gh_target; do
        case $gh_target in
        /dev/nvidiactl | /dev/nvidia[0-9]*) in_list "$GPU_HOLDERS" "$gh_pid" || GPU_HOLDERS="$GPU_HOLDERS $gh_pid" ;;
        esac
    done <<EOF
$gh_hits
EOF
    sort_pids "$GPU_HOLDERS"
    GPU_HOLDERS=$SORTED
}

# is_gpu_daemon PID: system services that hold the GPU on purpose; killing them
# does not help a relaunch and systemd would restart them anyway.
is_gpu_daemon() {
    load_cmd "$1"
    ig_arg0=${CMDLINE%% *}
    case ${ig_arg0##*/} in
    nvidia-persistenced | nv-hostengine | nv-fabricmanager | nvidia-fabricmanager | dcgm-exporter | Xorg | X) return 0 ;;
    esac
    return 1
}

# -------------------------------------------------------------- signals

# strip_zeros NUMBER: print NUMBER without leading zeros ($((08)) is an error).
strip_zeros() {
    sz_n=$1
    while :; do
        case $sz_n in 0?*) sz_n=${sz_n#0} ;; *) break ;; esac
    done
    printf '%s' "$sz_n"
}

# parse_seconds VALUE: DS = VALUE (seconds, maybe fractional) in deciseconds.
parse_seconds() {
    case $1 in '' | . | *[!0-9.]* | *.*.*) return 1 ;; esac
    ps_int=$(strip_zeros "${1%%.*}") ps_frac=
    case $1 in *.*) ps_frac=${1#*.} ;; esac
    [ "${#ps_int}" -le 6 ] || return 1
    ps_tenth=${ps_frac%"${ps_frac#?}"}
    DS=$(( ${ps_int:-0} * 10 + ${ps_tenth:-0} ))
}

# wait_gone LIST DECISECONDS: poll (fast at first: POLL_CS) until every process of LIST is gone (zombies
# count as gone) or the time is up; ALIVE = the ones still there.
wait_gone() {
    wg_waited=0 # centiseconds
    while :; do
        ALIVE=
        for wg_pid in $1; do
            wg_start=''
            eval "wg_start=\${ST_$wg_pid-}"
            proc_alive "$wg_pid" "$wg_start" && ALIVE="$ALIVE $wg_pid"
        done
        [ -n "$ALIVE" ] || return 0
        [ "$wg_waited" -lt "$(($2 * 10))" ] || return 1
        wg_cs=$POLL_CS_LAST
        for wg_at in $POLL_CS; do
            if [ "$wg_at" -gt "$wg_waited" ]; then
                wg_cs=$((wg_at - wg_waited))
                break
            fi
        done
        sleep "$((wg_cs / 100)).$((wg_cs / 10 % 10))$((wg_cs % 10))"
        wg_waited=$((wg_waited + wg_cs))
    done
}

# kill_lock / kill_unlock: one cleanup kills at a time on this node (or in this
# container). Two cleanups at once both saw the same processes, both signalled them,
# and both reported every kill as theirs; under the lock the second one scans after
# the first is done, and reports only what it ended itself. flock(1) on
# KILL_LOCK_FILE (the kernel drops it with its holder, however that dies); opened
# read-only when another user created it (flock works on any open file). Waits up to
# the grace period plus 30 s, then goes ahead and says so. Without flock(1) there is
# no lock (also said): the kill and its report still only claim what this run's own
# signal was sent to and what then ended (terminate).
KILL_LOCK_FILE=/tmp/.fleet-cleanup-kill.lock
KILL_LOCKED=0
kill_lock() {
    KILL_LOCKED=0
    if ! command -v flock >/dev/null 2>&1; then
        say "kill: flock(1) not found: not serialised with other cleanups on this node"
        return 0
    fi
    # `command exec`: a failed redirection must not end the script (it would, on a bare exec)
    { command exec 8>>"$KILL_LOCK_FILE"; } 2>/dev/null ||
        { command exec 8<"$KILL_LOCK_FILE"; } 2>/dev/null || {
        say "kill: cannot open $KILL_LOCK_FILE: not serialised with other cleanups on this node"
        return 0
    }
    KILL_LOCKED=1
    flock -n 8 && return 0
    kl_wait=$((GRACE_DS / 10 + 30))
    say "kill: another cleanup is killing on this node; waiting for it (up to ${kl_wait}s)"
    flock -w "$kl_wait" 8 && return 0
    say "kill: the other cleanup still holds the kill lock after ${kl_wait}s; going ahead"
}
kill_unlock() {
    [ "$KILL_LOCKED" = 1 ] && exec 8>&-
    KILL_LOCKED=0
}

# terminate LIST: TERM (and CONT, so stopped processes see it), wait up to
# GRACE_DS, KILL the survivors, wait up to 5 s. One line per process. Sets
# T_TERM and T_KILL (counts) and T_LEFT (pids that survived even KILL, or that
# we may not signal at all: then there is no point in waiting for them).
# Only what this run did is claimed: a process that ended before our TERM reached it
# (kill failed, or it was gone when signalled) is not reported at all, and one whose
# KILL failed because it had ended meanwhile counts as ended by our TERM, not as left.
terminate() {
    T_TERM=0 T_KILL=0 T_LEFT='' T_ENDED=''
    tm_sent='' tm_denied=''
    for tm_pid in $1; do
        load_cmd "$tm_pid" # keep the command line for the report
    done
    for tm_pid in $1; do
        tm_start=''
        eval "tm_start=\${ST_$tm_pid-}"
        proc_alive "$tm_pid" "$tm_start" || continue # ended on its own: not ours
        if kill -s TERM "$tm_pid" 2>/dev/null; then
            kill -s CONT "$tm_pid" 2>/dev/null
            tm_sent="$tm_sent $tm_pid"
        elif proc_alive "$tm_pid" "$tm_start"; then
            say_proc "not permitted to signal $tm_pid (not root?): " "$tm_pid"
            tm_denied="$tm_denied $tm_pid"
        fi
    done
    tm_survivors=''
    if [ -n "$tm_sent" ]; then
        wait_gone "$tm_sent" "$GRACE_DS"
        tm_survivors=$ALIVE
    fi
    for tm_pid in $tm_sent; do
        in_list "$tm_survivors" "$tm_pid" && continue
        say_proc "killed $tm_pid (TERM): " "$tm_pid"
        T_TERM=$((T_TERM + 1))
        T_ENDED="$T_ENDED $tm_pid"
    done
    tm_killed=''
    for tm_pid in $tm_survivors; do
        tm_start=''
        eval "tm_start=\${ST_$tm_pid-}"
        if kill -s KILL "$tm_pid" 2>/dev/null; then
            tm_killed="$tm_killed $tm_pid"
        elif proc_alive "$tm_pid" "$tm_start"; then
            tm_denied="$tm_denied $tm_pid"
        else
            # ended between the wait and our KILL: after our TERM
            say_proc "killed $tm_pid (TERM): " "$tm_pid"
            T_TERM=$((T_TERM + 1))
            T_ENDED="$T_ENDED $tm_pid"
        fi
    done
    ALIVE=''
    [ -z "$tm_killed" ] || wait_gone "$tm_killed" "$KILL_WAIT_DS"
    for tm_pid in $tm_killed; do
        in_list "$ALIVE" "$tm_pid" && continue
        say_proc "killed $tm_pid (KILL): " "$tm_pid"
        T_KILL=$((T_KILL + 1))
        T_ENDED="$T_ENDED $tm_pid"
    done
    for tm_pid in $ALIVE $tm_denied; do
        say_proc "left $tm_pid: " "$tm_pid"
        T_LEFT="$T_LEFT $tm_pid"
    done
}

# ---------------------------------------------------------------- ports

# net_table FILE: NET = FILE's content (empty if it cannot be read). Every read() of
# /proc/net/tcp walks the kernel's whole connection hash table (milliseconds on a big
# machine, however few sockets there are), and a reader that reads on to EOF pays one
# more walk for the empty read: dd takes it in one read, and only a table too big for
# that read (or a node without dd) is read to the end.
net_table() {
    NET=$(dd if="$1" bs=4194304 count=1 2>/dev/null) && [ "${#NET}" -lt 4190000 ] ||
        NET=$(cat "$1" 2>/dev/null)
}

# listen_inodes PORT: INODES = inodes of TCP sockets LISTENing on PORT (v4/v6).
listen_inodes() {
    INODES=
    li_hex=$(printf '%04X' "$1")
    net_table /proc/net/tcp
    li_tcp=$NET
    net_table /proc/net/tcp6
    # grep picks the lines (a busy node has thousands of connections): local port
    # $li_hex, state 0A (LISTEN).
    li_lines=$(printf '%s\n%s\n' "$li_tcp" "$NET" |
        grep -E -e "^ *[0-9]+: [0-9A-F]+:$li_hex [0-9A-F]+:[0-9A-F]+ 0A ")
    IFS=$NL
    set -f
    for li_line in $li_lines; do
        IFS=$DEFAULT_IFS
        # shellcheck disable=SC2086  # fields: word splitting wanted
        set -- $li_line
        [ "$#" -ge 10 ] || continue
        li_inode=${10}
        in_list "$INODES" "$li_inode" || INODES="$INODES $li_inode"
    done
    set +f
    IFS=$DEFAULT_IFS
}

# port_holders PORT: INODES as above, HOLDERS = pids owning one of those sockets.
port_holders() {
    listen_inodes "$1"
    HOLDERS=
    [ -n "$INODES" ] || return 0
    set --
    for ph_inode in $INODES; do
        set -- "$@" "socket:[$ph_inode]"
    done
    ph_hits=$(fd_links "$@")
    while read -r ph_pid ph_target; do
        [ -n "$ph_pid" ] || continue
        ph_inode=${ph_target#socket:\[}
        ph_inode=${ph_inode%\]}
        in_list "$INODES" "$ph_inode" || continue
        in_list "$HOLDERS" "$ph_pid" || HOLDERS="$HOLDERS $ph_pid"
    done <<EOF
$ph_hits
EOF
    sort_pids "$HOLDERS"
    HOLDERS=$SORTED
}

# ---------------------------------------------------------------- paths

# expand_paths: MATCHES = newline-separated existing paths matching --path globs
# ("~" and "~/..." mean $HOME). No word splitting on spaces: IFS is newline.
# login_home: the home of the user who logged in. Under sudo, HOME is root's, but `~/.nv` in
# the operator's playbook means the login user's (as `sudo rm -rf ~/.nv` in their shell did).
login_home() {
    if [ -n "${SUDO_USER:-}" ] && [ "$SUDO_USER" != root ]; then
        lh=$(getent passwd "$SUDO_USER" 2>/dev/null | cut -d: -f6)
        if [ -n "$lh" ]; then
            printf '%s\n' "$lh"
            return
        fi
    fi
    printf '%s\n' "${HOME:-}"
}

expand_paths() {
    MATCHES=
    EP_HOME=$(login_home)
    set -f
    IFS=$NL
    for ep_glob in $PATHS; do
        # shellcheck disable=SC2088  # a literal "~" from fleet: we expand it
        case $ep_glob in
        '~' | '~/'*)
            if [ -z "$EP_HOME" ]; then
                say "skipped (HOME is not set): $ep_glob"
                continue
            fi
            case $ep_glob in '~') ep_glob=$EP_HOME ;; *) ep_glob=$EP_HOME/${ep_glob#'~/'} ;; esac
            ;;
        esac
        set +f
        for ep_path in $ep_glob; do
            case $ep_path in . | .. | */. | */..) continue ;; esac
            [ -e "$ep_path" ] || [ -L "$ep_path" ] || continue # glob matched nothing
            case "$NL$MATCHES" in *"$NL$ep_path$NL"*) continue ;; esac
            MATCHES="$MATCHES$ep_path$NL"
        done
        set -f
    done
    IFS=$DEFAULT_IFS
    set +f
}

# real_path PATH: REAL = PATH with symlinks resolved in its directory part (and
# in PATH itself if it is a directory); a symlink itself stays a symlink.
real_path() {
    if [ -d "$1" ] && [ ! -L "$1" ]; then
        REAL=$(cd -P -- "$1" 2>/dev/null && pwd -P) || REAL=$1
        return 0
    fi
    case $1 in */*) rp_dir=${1%/*} ;; *) rp_dir=. ;; esac
    rp_base=${1##*/}
    rp_dir=$(cd -P -- "${rp_dir:-/}" 2>/dev/null && pwd -P) || {
        REAL=$1
        return 0
    }
    REAL=${rp_dir%/}/$rp_base
}

# ---------------------------------------------------------------- where state may be removed

# Training state lives below /tmp, /var/tmp, /dev/shm and the login home's ~/.cache (never
# those directories themselves), and in the login home's ~/.nv and ~/.triton (CUDA's and
# triton's kernel caches, whole or in part). Inside the login home only its own places count,
# even when the home is below /tmp. Each place counts as written and as physical (/dev/shm may
# be a link to /run/shm, a home a link to /data/home), never as `/`.

# add_place KIND DIR: PLACES gets "KIND DIR" and "KIND PHYSICAL-DIR" lines. KIND: home (the
# login home), below (anything below DIR), hbelow (the same, inside the home), at (DIR itself
# and anything below it).
add_place() {
    PLACES="$PLACES$1 $2$NL"
    ad_real=$(cd -P -- "$2" 2>/dev/null && pwd -P) || return 0
    [ "$ad_real" = "$2" ] || [ "$ad_real" = / ] || PLACES="$PLACES$1 $ad_real$NL"
}

# state_places: PLACES and PLACES_TEXT (the same, for people), once per run.
state_places() {
    [ -z "${PLACES_TEXT:-}" ] || return 0
    PLACES=
    for sp_dir in /tmp /var/tmp /dev/shm; do add_place below "$sp_dir"; done
    PLACES_HOME=$(login_home)
    if [ -n "$PLACES_HOME" ]; then
        [ "$PLACES_HOME" = / ] || add_place home "$PLACES_HOME"
        add_place hbelow "$PLACES_HOME/.cache"
        add_place at "$PLACES_HOME/.nv"
        add_place at "$PLACES_HOME/.triton"
    fi
    PLACES_TEXT="below /tmp, /var/tmp, /dev/shm or ~/.cache; ~/.nv, ~/.triton"
}

# norm_path PATH: NORM = absolute PATH with //, /./ and /../ resolved as text (/.. is /).
norm_path() {
    np_ifs=$IFS
    case $- in *f*) np_noglob=1 ;; *) np_noglob= ;; esac
    set -f
    np_out=
    IFS=/
    for np_part in $1; do
        case $np_part in
        '' | .) ;;
        ..) np_out=${np_out%/*} ;;
        *) np_out=$np_out/$np_part ;;
        esac
    done
    IFS=$np_ifs
    [ -n "$np_noglob" ] || set +f
    NORM=${np_out:-/}
}

# only_wildcards NAME: NAME is nothing but wildcards, [...] sets and dots (`*`, `.*`, `[!.]*`):
# as the first name below /tmp it would match everything there, other users' files too.
only_wildcards() {
    [ -z "$(printf '%s\n' "$1" | sed 's/\[[^]]*\]//g; s/[*?.\\]//g')" ]
}

# outside_places PATH [GLOB]: true, with WHY, when absolute, normalised PATH is neither below a
# "below" place (not counted inside the home) or "hbelow" place nor at or below an "at" place;
# with GLOB non-empty, also when PATH's first name below such a place is only wildcards.
outside_places() {
    op_in_home=
    while IFS=' ' read -r op_kind op_dir; do
        [ "$op_kind" = home ] || continue
        case $1 in "$op_dir" | "$op_dir"/*) op_in_home=1 ;; esac
    done <<EOF
$PLACES
EOF
    while IFS=' ' read -r op_kind op_dir; do
        case $op_kind in
        at) case $1 in "$op_dir" | "$op_dir"/*) return 1 ;; esac ;;
        below | hbelow)
            [ "$op_kind" = hbelow ] || [ -z "$op_in_home" ] || continue
            case $1 in "$op_dir"/?*) ;; *) continue ;; esac
            op_first=${1#"$op_dir"/}
            op_first=${op_first%%/*}
            if [ -n "${2:-}" ] && only_wildcards "$op_first"; then
                WHY="'$op_first' matches everything in $op_dir"
                return 0
            fi
            return 1
            ;;
        esac
    done <<EOF
$PLACES
EOF
    WHY="not where training state lives ($PLACES_TEXT)"
    return 0
}

# physical GLOB: PHYS = absolute, normalised GLOB with its directories before the first name
# with a wildcard (and before the last name) resolved physically, as far as they exist.
physical() {
    ph_pre=${1%/*}
    case $ph_pre in *[*?[]*)
        ph_pre=${ph_pre%%[*?[]*}
        ph_pre=${ph_pre%/*}
        ;;
    esac
    ph_rest=${1#"$ph_pre"}
    ph_tail=
    while [ -n "$ph_pre" ] && [ ! -d "$ph_pre" ]; do
        ph_tail=/${ph_pre##*/}$ph_tail
        ph_pre=${ph_pre%/*}
    done
    ph_real=$(cd -P -- "${ph_pre:-/}" 2>/dev/null && pwd -P) || ph_real=$ph_pre
    PHYS=${ph_real%/}$ph_tail$ph_rest
}

# path_problem GLOB: WHY a --path may not be removed, or false: relative, outside the places as
# written (~ is the login home; //, . and .. resolved as text), or once its leading
# directories are resolved.
path_problem() {
    # shellcheck disable=SC2088  # a literal "~" from fleet: we expand it
    case $1 in
    '~' | '~/'*) [ -n "$PLACES_HOME" ] || return 1 ;; # expand_paths skips it: HOME is not set
    esac
    # shellcheck disable=SC2088  # a literal "~" from fleet: we expand it
    case $1 in
    '~') pp_abs=$PLACES_HOME ;;
    '~/'*) pp_abs=$PLACES_HOME/${1#'~/'} ;;
    *) pp_abs=$1 ;;
    esac
    case $pp_abs in
    /*) ;;
    *)
        WHY="relative: give an absolute path or ~/..."
        return 0
        ;;
    esac
    norm_path "$pp_abs"
    if outside_places "$NORM" glob; then
        [ "$NORM" = "$1" ] || WHY="$NORM: $WHY"
        return 0
    fi
    physical "$NORM"
    if [ "$PHYS" != "$NORM" ] && outside_places "$PHYS" glob; then
        WHY="resolves to $PHYS: $WHY"
        return 0
    fi
    return 1
}

# check_state_paths: refuse the run, before anything happens on this node, when a --path
# has a path_problem: one line per such path, then a summary line; exit 1.
check_state_paths() {
    state_places
    cs_bad=0
    IFS=$NL
    set -f
    for cs_glob in $PATHS; do
        IFS=$DEFAULT_IFS
        path_problem "$cs_glob" || continue
        say "refused --path '$cs_glob': $WHY"
        cs_bad=$((cs_bad + 1))
    done
    set +f
    IFS=$DEFAULT_IFS
    [ "$cs_bad" -eq 0 ] && return 0
    say "refused: $(plural "$cs_bad" "state path") outside the places training state lives; did nothing on this node (--allow-any-path to allow)"
    exit 1
}

# outside_matches: say "refused (resolves to REAL): PATH" for each of MATCHES whose physical
# path is outside the places (a symlinked directory on the way); true when there was any.
outside_matches() {
    state_places
    om_bad=0
    IFS=$NL
    set -f
    for om_path in $MATCHES; do
        IFS=$DEFAULT_IFS
        real_path "$om_path"
        outside_places "$REAL" || continue
        say "refused (resolves to $REAL): $om_path"
        om_bad=$((om_bad + 1))
    done
    set +f
    IFS=$DEFAULT_IFS
    [ "$om_bad" -gt 0 ]
}

# unix_links STRING...: print "PID PATH" for every process holding a unix socket bound at
# a path that contains one of STRINGs. A bound socket shows in /proc/PID/fd as
# socket:[INODE], not as its path, and is neither a cwd nor a mapping: a live DataLoader
# worker holds its /tmp/pymp-*/ only through multiprocessing's listener-* socket in it, a
# live torch_shm_manager its /tmp/torch-shm-dir-*/ through manager.sock. /proc/net/unix
# pairs each inode with the path it was bound at.
unix_links() {
    ul_n=$#
    while [ "$ul_n" -gt 0 ]; do
        set -- "$@" -e " $1"
        shift
        ul_n=$((ul_n - 1))
    done
    net_table /proc/net/unix
    ul_lines=$(printf '%s\n' "$NET" | grep -F "$@")
    set --
    IFS=$NL
    set -f
    for ul_line in $ul_lines; do
        IFS=$DEFAULT_IFS
        # Num RefCount Protocol Flags Type St Inode Path: the path is all after field 7.
        ul_rest=$ul_line ul_i=0 ul_field=
        while [ "$ul_i" -lt 7 ]; do
            ul_rest=${ul_rest#"${ul_rest%%[! ]*}"}
            ul_field=${ul_rest%% *}
            ul_rest=${ul_rest#"$ul_field"}
            ul_i=$((ul_i + 1))
        done
        ul_rest=${ul_rest# }
        case $ul_field in '' | *[!0-9]*) continue ;; esac
        case $ul_rest in /*) ;; *) continue ;; esac # unbound or abstract (@name)
        eval "UX_$ul_field=\$ul_rest"
        set -- "$@" "socket:[$ul_field]"
    done
    set +f
    IFS=$DEFAULT_IFS
    [ "$#" -gt 0 ] || return 0
    fd_links "$@" | while read -r ul_pid ul_target; do
        ul_inode=${ul_target#socket:\[}
        ul_inode=${ul_inode%\]}
        case $ul_inode in '' | *[!0-9]*) continue ;; esac
        eval "ul_path=\${UX_$ul_inode-}"
        [ -z "$ul_path" ] || printf '%s %s\n' "$ul_pid" "$ul_path"
    done
}

# env_links STRING...: print "PID VALUE" for every variable in a process's environment
# whose value contains one of STRINGs. torchrun tells each worker where its run's log dir
# is only through the environment (TORCHELASTIC_ERROR_FILE=/tmp/torchelastic_*/.../error.json,
# written when the worker fails); no fd points there unless its output is redirected.
# /proc/PID/environ is the environment the process started with. One grep finds the few
# processes that name any of STRINGs; only theirs are split into variables.
env_links() {
    el_n=$#
    while [ "$el_n" -gt 0 ]; do
        set -- "$@" -e "=$1"
        shift
        el_n=$((el_n - 1))
    done
    el_files=$(cd /proc && exec grep -l -F "$@" [0-9]*/environ 2>/dev/null)
    for el_file in $el_files; do
        el_pid=${el_file%/environ}
        case $el_pid in '' | *[!0-9]*) continue ;; esac
        tr '\000' '\n' <"/proc/$el_file" 2>/dev/null | grep -F "$@" |
            while IFS= read -r el_var; do
                printf '%s %s\n' "$el_pid" "${el_var#*=}"
            done
    done
}

# path_holders: HOLD = "PID TARGET" lines for fds, working directories, mappings, bound
# unix sockets and environment values touching any of MATCHES (one /proc scan of each
# kind for all of them).
path_holders() {
    set --
    IFS=$NL
    set -f
    for ph_path in $MATCHES; do
        real_path "$ph_path"
        set -- "$@" "$REAL"
    done
    set +f
    IFS=$DEFAULT_IFS
    HOLD=
    [ "$#" -gt 0 ] || return 0
    HOLD=$(
        fd_links --cwd "$@"
        map_links "$@"
        unix_links "$@"
        env_links "$@"
    )
}

# holders_of PATH: IN_USE = pids from HOLD using PATH or anything below it.
holders_of() {
    IN_USE=
    [ -L "$1" ] && return 0 # removing a symlink never pulls a file from under anyone
    real_path "$1"
    while read -r ho_pid ho_target; do
        [ -n "$ho_pid" ] || continue
        case $ho_target in
        "$REAL" | "$REAL"/*) in_list "$IN_USE" "$ho_pid" || IN_USE="$IN_USE $ho_pid" ;;
        esac
    done <<EOF
$HOLD
EOF
    sort_pids "$IN_USE"
    IN_USE=$SORTED
}

# describe_users: USERS_TEXT = "PID CMD[, +N more]" for IN_USE.
describe_users() {
    du_first=${IN_USE%% *}
    short_cmd "$du_first"
    USERS_TEXT="$du_first $SHORT"
    # shellcheck disable=SC2086  # pids: word splitting wanted
    set -- $IN_USE
    [ "$#" -le 1 ] || USERS_TEXT="$USERS_TEXT, +$(($# - 1)) more"
}

# -------------------------------------------------------------- actions

action_kill() {
    kill_lock # before the scan: what another cleanup is ending is not ours to claim
    scan_procs
    build_exclusions
    match_patterns
    KILLSET=$MATCHED
    if [ "$KILL_GPU" = 1 ]; then
        gpu_holders
        for ak_pid in $GPU_HOLDERS; do
            is_excluded "$ak_pid" && continue
            in_list "$KILLSET" "$ak_pid" && continue
            if is_gpu_daemon "$ak_pid"; then
                say_proc "gpu holder $ak_pid not killed (system daemon): " "$ak_pid"
            else
                KILLSET="$KILLSET $ak_pid"
            fi
        done
    fi
    sort_pids "$KILLSET"
    KILLSET=$SORTED
    T_TERM=0 T_KILL=0 T_LEFT=''
    if [ -n "$KILLSET" ]; then
        # shellcheck disable=SC2086  # pids: word splitting wanted
        set -- $KILLSET
        say "kill: sending TERM to $(plural "$#" process), KILL after ${GRACE}s"
        terminate "$KILLSET"
    fi
    kill_unlock
    if [ "$KILL_GPU" != 1 ]; then
        gpu_holders
        for ak_pid in $GPU_HOLDERS; do
            is_excluded "$ak_pid" && continue
            is_gpu_daemon "$ak_pid" && continue
            say_proc "gpu holder $ak_pid not killed (pass kill_gpu_holders=true): " "$ak_pid"
        done
    fi
    ak_ended=$((T_TERM + T_KILL))
    ak_detail="$ak_ended ended ($T_TERM by TERM, $T_KILL by KILL)"
    if [ -n "$T_LEFT" ]; then
        # shellcheck disable=SC2086  # pids: word splitting wanted
        set -- $T_LEFT
        say "kill: $# left (pids ${T_LEFT# }); $ak_detail"
        return 1
    fi
    if [ "$ak_ended" -eq 0 ]; then
        say "kill: nothing matched"
        return 0
    fi
    say "kill: $ak_detail"
}

action_gpu_reset() {
    if ! command -v nvidia-smi >/dev/null 2>&1; then
        say "gpu-reset: skipped: no nvidia-smi"
        return 0
    fi
    ag_deadline=
    command -v timeout >/dev/null 2>&1 && ag_deadline="timeout 120"
    # shellcheck disable=SC2086  # empty or "timeout 120": word splitting wanted
    ag_out=$($ag_deadline nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>&1)
    ag_rc=$?
    if [ "$ag_rc" -ne 0 ]; then
        say "$ag_out"
        say "gpu-reset: failed: nvidia-smi --query-compute-apps (exit $ag_rc)"
        return 1
    fi
    ag_busy=
    set -f
    for ag_word in $ag_out; do
        case $ag_word in '' | *[!0-9]*) ;; *) ag_busy="$ag_busy $ag_word" ;; esac
    done
    set +f
    gpu_holders
    sort_pids "$ag_busy $GPU_HOLDERS"
    if [ -n "$SORTED" ]; then
        for ag_pid in $GPU_HOLDERS; do
            say_proc "gpu holder $ag_pid: " "$ag_pid"
        done
        say "gpu-reset: skipped: GPU busy (pids $SORTED)"
        return 0
    fi
    # shellcheck disable=SC2086  # empty or "timeout 120": word splitting wanted
    ag_out=$($ag_deadline nvidia-smi --gpu-reset 2>&1)
    ag_rc=$?
    [ -z "$ag_out" ] || say "$ag_out"
    if [ "$ag_rc" -ne 0 ]; then
        [ "$ag_rc" -ne 124 ] || say "nvidia-smi --gpu-reset timed out"
        say "gpu-reset: failed (exit $ag_rc)"
        return 1
    fi
    say "gpu-reset: done"
}

action_state() {
    expand_paths
    if [ "$ALLOW_ANY_PATH" != 1 ] && outside_matches; then
        # refused before anything is removed: the state part removes all or nothing here
        say "state: removed 0, kept 0, refused $om_bad (outside the places training state lives)"
        return 1
    fi
    path_holders
    as_removed=0 as_kept=0 as_refused=0 as_failed=0
    as_home='' as_login_home=''
    [ -z "${HOME:-}" ] || as_home=$(cd -P -- "$HOME" 2>/dev/null && pwd -P)
    [ -z "$EP_HOME" ] || as_login_home=$(cd -P -- "$EP_HOME" 2>/dev/null && pwd -P)
    IFS=$NL
    set -f
    for as_path in $MATCHES; do
        IFS=$DEFAULT_IFS
        real_path "$as_path"
        if [ ! -L "$as_path" ] && { [ "$REAL" = / ] || [ "$REAL" = "${as_home:-}" ] ||
            [ "$REAL" = "${as_login_home:-}" ]; }; then
            say "refused (resolves to $REAL): $as_path"
            as_refused=$((as_refused + 1))
            continue
        fi
        holders_of "$as_path"
        if [ -n "$IN_USE" ]; then
            describe_users
            say "kept (in use by $USERS_TEXT): $as_path"
            as_kept=$((as_kept + 1))
            continue
        fi
        # rm -rf never follows symlinks: a link is removed, not its target.
        if as_err=$(rm -rf -- "$as_path" 2>&1) && ! { [ -e "$as_path" ] || [ -L "$as_path" ]; }; then
            say "removed: $as_path"
            as_removed=$((as_removed + 1))
        else
            say "failed: $as_path: ${as_err:-still there}"
            as_failed=$((as_failed + 1))
        fi
    done
    set +f
    IFS=$DEFAULT_IFS
    as_summary="state: removed $as_removed, kept $as_kept"
    [ "$as_refused" -eq 0 ] || as_summary="$as_summary, refused $as_refused"
    [ "$as_failed" -eq 0 ] || as_summary="$as_summary, failed $as_failed"
    say "$as_summary"
    [ "$as_refused" -eq 0 ] && [ "$as_failed" -eq 0 ]
}

action_port() {
    ap_port=$PORTS
    kill_lock
    scan_procs
    build_exclusions
    port_holders "$ap_port"
    if [ -z "$INODES" ]; then
        kill_unlock
        say "port $ap_port: free"
        return 0
    fi
    if [ -z "$HOLDERS" ]; then
        kill_unlock
        say "port $ap_port: held by a listening socket that no visible process owns (inode${INODES}; another PID namespace?)"
        say "port $ap_port: still held (no visible process)"
        return 1
    fi
    ap_kill=
    for ap_pid in $HOLDERS; do
        say_proc "port $ap_port: held by $ap_pid (" "$ap_pid" ")"
        if is_excluded "$ap_pid"; then
            say "port $ap_port: not killing $ap_pid: it is this cleanup's own caller"
        else
            ap_kill="$ap_kill $ap_pid"
        fi
    done
    terminate "$ap_kill"
    kill_unlock
    port_holders "$ap_port"
    if [ -n "$INODES" ]; then
        if [ -n "$HOLDERS" ]; then
            say "port $ap_port: still held by $HOLDERS"
        else
            say "port $ap_port: still held (no visible process)"
        fi
        return 1
    fi
    ap_killed=
    for ap_pid in $T_ENDED; do
        short_cmd "$ap_pid"
        ap_killed="$ap_killed${ap_killed:+, }$ap_pid $SHORT"
    done
    if [ -n "$ap_killed" ]; then
        say "port $ap_port: freed (killed $ap_killed)"
    else
        say "port $ap_port: freed (its holder ended before this cleanup signalled it)"
    fi
}

action_verify() {
    scan_procs
    build_exclusions
    av_procs=0 av_ports='' av_paths=0 av_gpu=0
    if [ -n "$PATTERNS" ]; then
        match_patterns
        for av_pid in $MATCHED; do
            say_proc "left process $av_pid: " "$av_pid"
            av_procs=$((av_procs + 1))
        done
    fi
    for av_port in $PORTS; do
        [ -z "${PORT_CHECKED:-}" ] || break
        port_holders "$av_port"
        [ -n "$INODES" ] || continue
        av_ports="$av_ports $av_port"
        if [ -z "$HOLDERS" ]; then
            say "left port $av_port: held by a socket no visible process owns"
        fi
        for av_pid in $HOLDERS; do
            say_proc "left port $av_port: held by $av_pid (" "$av_pid" ")"
        done
    done
    if [ -n "$PATHS" ]; then
        expand_paths
        path_holders
        IFS=$NL
        set -f
        for av_path in $MATCHES; do
            IFS=$DEFAULT_IFS
            holders_of "$av_path"
            if [ -n "$IN_USE" ]; then
                describe_users
                say "left path: $av_path (in use by $USERS_TEXT)"
            else
                say "left path: $av_path"
            fi
            av_paths=$((av_paths + 1))
        done
        set +f
        IFS=$DEFAULT_IFS
    fi
    if [ "$CHECK_GPU" = 1 ]; then
        gpu_holders
        for av_pid in $GPU_HOLDERS; do
            is_excluded "$av_pid" && continue
            is_gpu_daemon "$av_pid" && continue
            say_proc "left gpu holder $av_pid: " "$av_pid"
            av_gpu=$((av_gpu + 1))
        done
    fi
    av_summary=
    [ "$av_procs" -eq 0 ] || av_summary="$av_summary, $(plural "$av_procs" process)"
    if [ -n "$av_ports" ]; then
        # shellcheck disable=SC2086  # port numbers: word splitting wanted
        set -- $av_ports
        if [ "$#" -eq 1 ]; then
            av_summary="$av_summary, port $1"
        else
            av_summary="$av_summary, ports $*"
        fi
    fi
    [ "$av_paths" -eq 0 ] || av_summary="$av_summary, $(plural "$av_paths" path)"
    [ "$av_gpu" -eq 0 ] || av_summary="$av_summary, $(plural "$av_gpu" "gpu holder")"
    if [ -z "$av_summary" ]; then
        say "clean"
        return 0
    fi
    say "left: ${av_summary#, }"
    return 1
}

# all: the whole cleanup sequence in one go (one SSH session, one script load, instead of
# one per action): kill, gpu-reset, state, port, verify. Each part prints its own lines;
# the last line sums up: "clean" when every part went well and verify found nothing, else
# what is left and which parts failed. Exit 1 if anything failed or is left.
action_all() {
    aa_failed=''
    action_kill || aa_failed="$aa_failed, kill"
    action_gpu_reset || aa_failed="$aa_failed, gpu-reset"
    action_state || aa_failed="$aa_failed, state"
    # verify checks no port again: the port part has just found it free (or says what
    # holds it, and failed), and each look at the TCP tables costs milliseconds.
    if action_port; then
        PORT_CHECKED=1
    else
        aa_failed="$aa_failed, port"
    fi
    CHECK_GPU=$KILL_GPU
    aa_verdict=$(action_verify)
    aa_rc=$?
    aa_last=${aa_verdict##*"$NL"}
    [ "$aa_verdict" = "$aa_last" ] || printf '%s\n' "${aa_verdict%"$NL"*}"
    if [ -z "$aa_failed" ]; then
        say "$aa_last"
        return "$aa_rc"
    fi
    if [ "$aa_rc" -eq 0 ]; then
        say "failed: ${aa_failed#, } (nothing left behind)"
    else
        say "$aa_last; failed: ${aa_failed#, }"
    fi
    return 1
}

# list: what kill would end, without ending it; the summary is key=value for `fleet status`.
action_list() {
    scan_procs
    build_exclusions
    match_patterns
    sort_pids "$MATCHED"
    al_count=0 al_pids=''
    for al_pid in $SORTED; do
        say_proc "proc $al_pid " "$al_pid"
        al_count=$((al_count + 1))
        al_pids="$al_pids${al_pids:+,}$al_pid"
    done
    say "training=$al_count pids=$al_pids"
}

# -------------------------------------------------------------- options

# check_patterns: refuse patterns that are invalid or match everything. One grep per
# question for all of them; only when one fails, each pattern alone, to name it.
check_patterns() {
    printf 'x\n' | grep_patterns >/dev/null 2>&1
    if [ "$?" -eq 2 ]; then
        set -f
        IFS=$NL
        for cp_pat in $PATTERNS; do
            printf 'x\n' | grep -E -e "$cp_pat" >/dev/null 2>&1
            [ "$?" -ne 2 ] || die_usage "--pattern is not a valid extended regex: $cp_pat"
        done
        IFS=$DEFAULT_IFS
        set +f
    fi
    if printf '\n' | grep_patterns >/dev/null 2>&1; then
        set -f
        IFS=$NL
        for cp_pat in $PATTERNS; do
            if printf '\n' | grep -E -e "$cp_pat" >/dev/null 2>&1; then
                die_usage "--pattern '$cp_pat' matches the empty string, so it would match every process"
            fi
        done
        IFS=$DEFAULT_IFS
        set +f
    fi
}

parse_args() {
    ACTION=$1
    shift
    case $ACTION in
    kill) pa_allowed='--pattern --grace --kill-gpu-holders' ;;
    gpu-reset) pa_allowed= ;;
    state) pa_allowed='--path --allow-any-path' ;;
    port) pa_allowed='--port --grace' ;;
    verify) pa_allowed='--pattern --port --path --gpu-holders' ;;
    list) pa_allowed='--pattern' ;;
    all) pa_allowed='--pattern --grace --kill-gpu-holders --port --path --allow-any-path' ;;
    *) die_usage "unknown action: $ACTION" ;;
    esac
    PATTERNS='' PATHS='' PORTS='' GRACE=10 GRACE_DS=100 KILL_GPU=0 CHECK_GPU=0 ALLOW_ANY_PATH=0
    while [ "$#" -gt 0 ]; do
        case $1 in
        -h | --help)
            usage
            exit 0
            ;;
        esac
        in_list "$pa_allowed" "$1" || die_usage "unknown option for $ACTION: $1"
        case $1 in
        --kill-gpu-holders)
            KILL_GPU=1
            shift
            continue
            ;;
        --gpu-holders)
            CHECK_GPU=1
            shift
            continue
            ;;
        --allow-any-path)
            ALLOW_ANY_PATH=1
            shift
            continue
            ;;
        esac
        [ "$#" -ge 2 ] || die_usage "$1 needs a value"
        case $1 in
        --pattern)
            [ -n "$2" ] || die_usage "--pattern must not be empty (it would match every process)"
            case $2 in *"$NL"*) die_usage "--pattern must be a single line" ;; esac
            PATTERNS="$PATTERNS$2$NL"
            ;;
        --path)
            [ -n "$2" ] || die_usage "--path must not be empty"
            case $2 in *"$NL"*) die_usage "--path must be a single line" ;; esac
            PATHS="$PATHS$2$NL"
            ;;
        --port)
            case $2 in '' | *[!0-9]*) die_usage "--port needs a number, got: $2" ;; esac
            if [ "${#2}" -gt 6 ] || [ "$2" -lt 1 ] || [ "$2" -gt 65535 ]; then
                die_usage "--port must be 1-65535, got: $2"
            fi
            if [ "$ACTION" = port ] || [ "$ACTION" = all ] && [ -n "$PORTS" ]; then
                die_usage "$ACTION takes a single --port"
            fi
            PORTS="${PORTS:+$PORTS }$(strip_zeros "$2")"
            ;;
        --grace)
            parse_seconds "$2" || die_usage "--grace needs seconds (e.g. 10 or 0.5), got: $2"
            GRACE=$2
            GRACE_DS=$DS
            ;;
        esac
        shift 2
    done
    [ -z "$PATTERNS" ] || check_patterns
    case $ACTION in
    kill) [ -n "$PATTERNS" ] || die_usage "kill needs at least one --pattern" ;;
    list) [ -n "$PATTERNS" ] || die_usage "list needs at least one --pattern" ;;
    all)
        [ -n "$PATTERNS" ] || die_usage "all needs at least one --pattern"
        [ -n "$PORTS" ] || die_usage "all needs --port"
        [ -n "$PATHS" ] || die_usage "all needs at least one --path"
        ;;
    state) [ -n "$PATHS" ] || die_usage "state needs at least one --path" ;;
    port) [ -n "$PORTS" ] || die_usage "port needs --port" ;;
    verify)
        [ -n "$PATTERNS$PORTS$PATHS" ] || [ "$CHECK_GPU" = 1 ] ||
            die_usage "verify needs something to check (--pattern, --port, --path or --gpu-holders)"
        ;;
    esac
}

main() {
    exec </dev/null # the script itself arrives on stdin: keep children off it
    [ "$#" -gt 0 ] || die_usage "missing action"
    case $1 in -h | --help | help)
        usage
        exit 0
        ;;
    esac
    parse_args "$@"
    case $ACTION in state | all) [ "$ALLOW_ANY_PATH" = 1 ] || check_state_paths ;; esac
    case $ACTION in
    kill) action_kill ;;
    gpu-reset) action_gpu_reset ;;
    state) action_state ;;
    port) action_port ;;
    verify) action_verify ;;
    list) action_list ;;
    all) action_all ;;
    esac
}

main "$@"; exit "$?"
