# fleet/remote/lib.sh: shell helpers shared by fleet's node-side scripts (POSIX sh: dash, bash,
# busybox), put in place of a script's `# fleet:source lib.sh` line (fleet/core/playbook.py). The script
# sets SCRIPT, its name for messages, before that line.
LC_ALL=C
export LC_ALL
unset CDPATH
NL='
'
IFS=' 	
'
DEFAULT_IFS=$IFS
SOH=$(printf '\001')

say() { printf '%s\n' "$*"; }
fail() { say "$*" && exit 1; }
finish() { say "$*" && exit 0; }
die_usage() {
    printf '%s: %s\n' "${SCRIPT:-fleet}" "$1" >&2
    exit 2
}
# within TENTHS CMD...: true once CMD is, tried again every 0.1 s for TENTHS tenths of a second.
within() {
    wi_n=$1
    shift
    until "$@"; do
        [ "$wi_n" -gt 0 ] || return 1
        sleep 0.1
        wi_n=$((wi_n - 1))
    done
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
# grep_nul: GREP_A = the option grep needs to read text with NULs: GNU grep's -a, none for busybox's.
grep_nul() { [ -n "${GREP_A+set}" ] || { GREP_A=-a && printf 'x\n' | grep -a -e x >/dev/null 2>&1 || GREP_A=''; }; }
# environ GREP-ARGS...: the environments grep picks, one `PID/environ:VAR<SOH>VAR<SOH>...` line
# each. busybox grep stops reading a line at a NUL, so the NULs after the variables become SOH first.
environ() {
    grep_nul
    # shellcheck disable=SC2086 # GREP_A: empty or one option
    (cd /proc && exec grep -H $GREP_A -e '' [0-9]*/environ 2>/dev/null) | tr '\000' "$SOH" | grep "$@"
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
        IFS= read -r PS_LINE
        while IFS= read -r ps_more; do PS_LINE="$PS_LINE$NL$ps_more"; done
    } 2>/dev/null <"/proc/$1/stat"
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
# ftype PATH: FTYPE = l symlink, d directory, f regular file, o other; false, with -, for nothing.
# shellcheck disable=SC2034 # FTYPE is for the caller
ftype() {
    if [ -L "$1" ]; then FTYPE=l; elif [ -d "$1" ]; then FTYPE=d
    elif [ -f "$1" ]; then FTYPE=f; elif [ -e "$1" ]; then FTYPE=o; else FTYPE=- && return 1; fi
}
# put FILE TEXT: FILE holds TEXT and a newline, written aside (a dot name) and renamed: a reader
# never sees half of it.
put() { printf '%s\n' "$2" >"${1%/*}/.${1##*/}.tmp.$$" && mv -f "${1%/*}/.${1##*/}.tmp.$$" "$1"; }

# tilde PATH [HOME]: TILDE = PATH with a leading `~` or `~/` read as HOME (default $HOME).
# shellcheck disable=SC2088,SC2034 # a literal ~, expanded here; TILDE is for the caller
tilde() { case $1 in "~" | "~/"*) TILDE=${2-$HOME}${1#"~"} ;; *) TILDE=$1 ;; esac }

# uptime_of PID: UPTIME = the seconds PID has run, 0 when it is gone.
# shellcheck disable=SC2034 # UPTIME is for the caller
uptime_of() {
    UPTIME=0
    proc_stat "$1" && read -r up_now _ </proc/uptime || return 0
    up_hz=$(getconf CLK_TCK 2>/dev/null) || up_hz=100
    UPTIME=$((${up_now%.*} - PS_START / up_hz))
}
# lock_take BASE WAIT_S WHAT: hold the lock BASE (flock(1) on fd 9) waiting up to WAIT_S seconds;
# false, with HOLDER = "PID WHAT" of the one that has it, when it stays taken. The kernel drops the
# lock with its holder: a killed start or stop never wedges it. flock comes with setsid in
# util-linux (busybox has both), which launch and the janitor need anyway: without it the script
# fails, saying so. lock_release drops the lock.
# shellcheck disable=SC2034 # HOLDER is for the caller
lock_take() {
    LK=$1 HOLDER='' LK_HELD=''
    command -v flock >/dev/null 2>&1 || fail "$SCRIPT: refused: flock (util-linux) is not installed on this host"
    { command exec 9>>"$LK"; } 2>/dev/null || return 1
    if flock -n 9 || { [ "$2" -gt 0 ] && flock -w "$2" 9; }; then
        LK_HELD=1
        put "$LK.owner" "$$ $3"
        return 0
    fi
    HOLDER=$(cat "$LK.owner" 2>/dev/null)
    exec 9>&-
    return 1
}

lock_release() { [ -z "${LK_HELD:-}" ] || { rm -f "$LK.owner"; exec 9>&-; LK_HELD=; }; }

# own_dir DIR: DIR is a directory of this uid's that no one else may write, made (0700) when
# missing; false, saying why, when it is not (a symlink, another uid's, group- or
# world-writable). mkdir never follows a symlink at DIR, and a symlink is refused before use:
# what fleet writes as root stays where fleet put it.
own_dir() {
    [ -e "$1" ] || [ -L "$1" ] || (umask 077 && mkdir -m 700 -- "$1") 2>/dev/null
    if [ -L "$1" ] || [ ! -d "$1" ]; then say "$SCRIPT: refused: $1 is not a directory (or is a symlink)" && return 1; fi
    # ls -ldn (POSIX, unlike stat): "drwx------ 2 UID GID ..."; group or others may not write.
    # shellcheck disable=SC2046 # split on purpose: the fields of ls's line
    od_me=$(id -u) && set -- "$1" $(ls -ldn -- "$1" 2>/dev/null)
    case $2 in
        d????w* | d???????w*) say "$SCRIPT: refused: $1 is writable by others (mode $2)" && return 1 ;;
    esac
    [ "${4:-}" = "$od_me" ] || { say "$SCRIPT: refused: $1 belongs to uid ${4:-?}, not $od_me" && return 1; }
}
# node_state: NODE_STATE = fleet's own directory on this node (launch runs, janitors, the cleanup
# lock), made when missing: /var/lib/fleet for root; for another login, one per node (name and
# machine id) under its state home, which NFS may share between nodes. Never a shared directory such as /tmp:
# another user could plant a symlink there or hold a lock. False, saying why, when it is not this
# uid's own (own_dir). FLEET_NODE_STATE (set on the node; tests) names another, as checked.
node_state() {
    if [ -n "${FLEET_NODE_STATE:-}" ]; then
        NODE_STATE=$FLEET_NODE_STATE
    elif [ "$(id -u)" = 0 ]; then
        NODE_STATE=/var/lib/fleet
        mkdir -p /var/lib 2>/dev/null
    else
        ns_home=${XDG_STATE_HOME:-}
        case $ns_home in /*) ;; *) ns_home=$HOME/.local/state ;; esac
        ns_id=$(cat /etc/machine-id 2>/dev/null) || ns_id='' # with the node's name: one per node
        (umask 077 && mkdir -p -- "$ns_home/fleet") 2>/dev/null
        NODE_STATE=$ns_home/fleet/node-$(printf '%s-%.12s' "$(uname -n)" "$ns_id" | tr -c 'A-Za-z0-9._-' _)
    fi
    own_dir "$NODE_STATE"
}
