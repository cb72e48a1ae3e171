# fleet/remote/lib.sh: shell helpers shared by fleet's node-side scripts (POSIX sh: dash, bash,
# busybox). Never run on its own: fleet puts this text where a script says `# fleet:source lib.sh`
# (fleet/playbook.py). The script sets SCRIPT, its name for messages, before that line.
LC_ALL=C
export LC_ALL
unset CDPATH
NL='
'
IFS=' 	
'
DEFAULT_IFS=$IFS

say() { printf '%s\n' "$*"; }
die_usage() {
    printf '%s: %s\n' "${SCRIPT:-fleet}" "$1" >&2
    exit 2
}

# to_hex [OD-ARGS]: HEX = the bytes od reads (stdin, or the file in OD-ARGS) as lowercase hex, "-"
# for none. Text from a node travels as hex: no byte of it can break a line or a field.
to_hex() {
    HEX=$(od -An -tx1 -v "$@" 2>/dev/null) || HEX=
    set -f
    # shellcheck disable=SC2086 # od's words, joined without separators below
    set -- $HEX
    IFS=
    HEX="$*"
    IFS=$DEFAULT_IFS; set +f
    [ -n "$HEX" ] || HEX=-
}

# parse_stat LINE: a /proc/PID/stat line into PS_STATE PS_PPID PS_PGID PS_SID PS_FLAGS PS_START
# and PS_COMM; false when LINE is not one. comm may hold anything but NUL (spaces, parentheses,
# newlines), so the fields are split after its last ") ".
parse_stat() {
    case $1 in *') '*) ;; *) return 1 ;; esac
    PS_COMM=${1#*\(}
    PS_COMM=${PS_COMM%\)*}
    # shellcheck disable=SC2086 # numeric fields: word splitting wanted
    set -- ${1##*') '}
    [ "$#" -ge 20 ] || return 1
    # shellcheck disable=SC2034 # each script uses the fields it needs
    PS_STATE=$1 PS_PPID=$2 PS_PGID=$3 PS_SID=$4 PS_FLAGS=$7 PS_START=${20}
}

# proc_stat PID: parse_stat of /proc/PID/stat, every line of it (a newline in comm splits it);
# false when the process is gone.
proc_stat() {
    PS_LINE=
    {
        {
            IFS= read -r PS_LINE
            while IFS= read -r ps_more; do PS_LINE="$PS_LINE$NL$ps_more"; done
        } <"/proc/$1/stat"
    } 2>/dev/null
    parse_stat "$PS_LINE"
}

# proc_is PID START: PID is still the process that started at START (clock ticks after boot) and
# no zombie: a pid the kernel has given to another process since is never taken for it.
proc_is() { proc_stat "$1" && case $PS_STATE in Z | X | x) false ;; *) [ "$PS_START" = "$2" ] ;; esac }

# real_path PATH: REAL = PATH with its directory resolved physically (a directory that is no
# symlink: all of it); a symlink stays itself. Without a fork: `cd -P` sets PWD.
real_path() {
    if [ -d "$1" ] && [ ! -L "$1" ]; then
        rp_dir=$1 rp_base=
    else
        case $1 in */*) rp_dir=${1%/*} rp_base=/${1##*/} ;; *) rp_dir=. rp_base=/$1 ;; esac
    fi
    if cd -P -- "${rp_dir:-/}" 2>/dev/null; then
        REAL=${PWD%/}$rp_base
        REAL=${REAL:-/}
        cd /
    else
        REAL=$1
    fi
}

# put FILE TEXT: FILE holds TEXT and a newline, written aside (a dot name) and renamed: a reader
# never sees half of it.
put() { printf '%s\n' "$2" >"${1%/*}/.${1##*/}.tmp.$$" && mv -f "${1%/*}/.${1##*/}.tmp.$$" "$1"; }

# tilde PATH: TILDE = PATH with a leading `~` or `~/` read as $HOME.
# shellcheck disable=SC2088,SC2034 # a literal ~, expanded here; TILDE is for the caller
tilde() { case $1 in "~") TILDE=$HOME ;; "~/"*) TILDE=$HOME/${1#"~/"} ;; *) TILDE=$1 ;; esac }

# uptime_of PID: UPTIME = the seconds PID has run, 0 when it is gone.
# shellcheck disable=SC2034 # UPTIME is for the caller
uptime_of() {
    UPTIME=0
    proc_stat "$1" && read -r up_now _ </proc/uptime || return 0
    up_hz=$(getconf CLK_TCK 2>/dev/null) || up_hz=100
    UPTIME=$((${up_now%.*} - PS_START / up_hz))
}

# lock_take BASE WAIT_S WHAT: hold the lock BASE on fd 9, waiting up to WAIT_S seconds; false,
# with HOLDER = "PID WHAT" of the one that has it, when it stays taken. flock(1) on BASE when the
# node has it (the kernel drops it with its holder); else the symlink BASE.l whose target is its
# owner (pid, start time, WHAT): made with one ln -s, it never exists without its owner, so a dead
# holder's lock can be taken over and a fresh one is never mistaken for it. lock_release drops it.
lock_take() {
    LK=$1 HOLDER='' lk_n=0
    if command -v flock >/dev/null 2>&1; then
        { command exec 9>>"$LK"; } 2>/dev/null || return 1
        if flock -n 9 || { [ "$2" -gt 0 ] && flock -w "$2" 9; }; then
            LK_KIND='flock'
            put "$LK.owner" "$$ $3"
            return 0
        fi
        HOLDER=$(cat "$LK.owner" 2>/dev/null)
        exec 9>&-
        return 1
    fi
    proc_stat $$
    lk_me="$$ $PS_START $3" # now: lock_stale's proc_is sets PS_START to the holder's
    until ln -s "$lk_me" "$LK.l" 2>/dev/null; do
        lock_stale && continue
        [ "$lk_n" -lt $(($2 * 10)) ] || return 1
        sleep 0.1
        lk_n=$((lk_n + 1))
    done
    LK_KIND='link'
}

# shellcheck disable=SC2034 # HOLDER is for lock_take's caller
# lock_stale: true when the lock's owner is gone and the lock was removed (try again). It is
# renamed aside first and its owner compared there: of two takers only one renames it, and a live
# lock renamed by mistake is put back (with ln -s: never over one taken since).
lock_stale() {
    lk_o=$(readlink "$LK.l" 2>/dev/null) || return 0 # released meanwhile
    HOLDER="${lk_o%% *} ${lk_o#* * }"
    # shellcheck disable=SC2086 # pid and start time: words
    proc_is ${lk_o%"${lk_o#* * }"} && return 1
    mv "$LK.l" "$LK.l.stale.$$" 2>/dev/null || return 0
    lk_s=$(readlink "$LK.l.stale.$$" 2>/dev/null)
    [ "$lk_s" = "$lk_o" ] || ln -s "$lk_s" "$LK.l" 2>/dev/null
    rm -f "$LK.l.stale.$$"
    [ "$lk_s" = "$lk_o" ]
}

lock_release() {
    case ${LK_KIND:-} in
        flock) rm -f "$LK.owner"; exec 9>&- ;;
        link) lk_o=$(readlink "$LK.l" 2>/dev/null) && [ "${lk_o%% *}" = $$ ] && rm -f "$LK.l" ;;
    esac
    LK_KIND=
}
