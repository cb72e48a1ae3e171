#!/bin/sh
# fleet/remote/facts.sh: what fleet needs to know about a node, on a node or in a container; its
# arguments and output: fleet/node/facts.py. It only reads (--dir-check's probe file aside): fleet
# decides in Python and act.sh acts. Full records only for what matches, descends from a match or
# holds a --path match, a GPU or the --port, and bulk reads (one cat of every stat file, one grep of
# every command line): thousands of processes stay cheap. Exit 0, `end` last; 2: usage.
# shellcheck disable=SC2034 # read by die_usage (lib.sh)
SCRIPT=facts.sh
# fleet:source lib.sh
MARK=FLEET_NODE_HELPER=
CMD_MAX=4096

out() { printf '%s\n' "$*" >&3; }
rec() { printf '%s\0' "$*"; }
sel() { case $SEL in *" $1 "*) ;; *) SEL="$SEL$1 " ;; esac }

# table PID: PID (parsed into PS_*) as a `t` line, unless it is a kernel thread or a zombie.
table() {
    case $1 in '' | *[!0-9]*) return 0 ;; esac
    case $PS_STATE in Z | X | x) return 0 ;; esac
    [ $((PS_FLAGS & 2097152)) -eq 0 ] || return 0 # PF_KTHREAD
    eval "PP_$1=\$PS_PPID C_$1=\$PS_COMM"
    PIDS="$PIDS $1"
    out "t $1 $PS_PPID $PS_PGID $PS_SID $PS_START $PS_STATE"
}
# scan: one cat reads every stat file. A comm with a newline splits its entry and the part after
# the newline may look like an entry: after a line that does not parse, the next one is dropped
# too, and each pid not seen is then read on its own.
scan() {
    sc_all=$(cd /proc && exec cat [0-9]*/stat 2>/dev/null)
    sc_split='' sc_any=''
    set -f; IFS=$NL
    for sc_l in $sc_all; do
        IFS=$DEFAULT_IFS
        if ! parse_stat "$sc_l"; then
            sc_split=1 sc_any=1
        elif [ -n "$sc_split" ]; then
            sc_split=
        else
            table "${sc_l%% *}"
        fi
    done
    IFS=$DEFAULT_IFS; set +f
    [ -n "$sc_any" ] || return 0
    for sc_l in /proc/[0-9]*; do
        sc_l=${sc_l#/proc/}
        eval "sc_seen=\${PP_$sc_l+1}"
        [ -n "$sc_seen" ] || ! proc_stat "$sc_l" || table "$sc_l"
    done
}
# match: SEL gains the processes (fleet's own left out) whose whole command line, NULs and
# newlines read as spaces, matches a --pattern (grep -E, like pkill -f), and their descendants
# (renamed workers). A match longer than CMD_MAX (its record holds only the start) gets a `hit`
# line naming the first pattern it matches.
match() {
    grep_nul
    mt_files='' # the files as one list: `set -- "$@" F` per process costs n^2 (3 s at 5,000)
    for mt_pid in $PIDS; do
        case $HELPERS in *" $mt_pid "*) ;; *) mt_files="$mt_files $mt_pid/cmdline" ;; esac
        eval "CL_$mt_pid="
    done
    set -f
    # shellcheck disable=SC2086 # GREP_A: empty or one option; mt_files: PID/cmdline words
    mt_out=$(cd /proc && grep -H $GREP_A -e '' /dev/null $mt_files 2>/dev/null | tr '\000' ' ')
    set -f; IFS=$NL
    mt_cands='' mt_last=''
    for mt_l in $mt_out; do
        mt_pid=${mt_l%%/*}
        case $mt_pid in '' | *[!0-9]*) continue ;; esac
        # grep gives each file's lines together: a pid new to the list is not the last one
        # (a test of the last one, not a match against the whole list: that is n^2)
        [ "$mt_pid" = "$mt_last" ] || mt_cands="$mt_cands $mt_pid" mt_last=$mt_pid
        eval "CL_$mt_pid=\${CL_$mt_pid:+\$CL_$mt_pid }\${mt_l#*/cmdline:}"
    done
    set --
    for mt_l in $PATTERNS; do set -- "$@" -e "$mt_l"; done
    IFS=$DEFAULT_IFS; set +f
    mt_out=$(
        for mt_pid in $mt_cands; do
            eval "mt_l=\$CL_$mt_pid"
            printf '%s\n' "${mt_l%"${mt_l##*[! ]}"}"
        done | grep -n -E "$@"
    )
    [ "$?" -lt 2 ] || out "error grep"
    mt_n=0
    for mt_pid in $mt_cands; do
        mt_n=$((mt_n + 1))
        case "$NL$mt_out" in *"$NL$mt_n:"*) sel "$mt_pid" ;; *) continue ;; esac
        eval "mt_l=\$CL_$mt_pid" && mt_l=${mt_l%"${mt_l##*[! ]}"} mt_i=0
        [ "${#mt_l}" -le "$CMD_MAX" ] || printf '%s' "$PATTERNS" | while IFS= read -r mt_p; do
            printf '%s\n' "$mt_l" | grep -q -E -e "$mt_p" && out "hit $mt_pid $mt_i" && break
            mt_i=$((mt_i + 1))
        done
    done
    mt_more=1
    while [ -n "$mt_more" ] && [ "$SEL" != ' ' ]; do
        mt_more=
        for mt_pid in $PIDS; do
            eval "mt_l=\$PP_$mt_pid"
            case $SEL in *" $mt_pid "*) ;; *" $mt_l "*) SEL="$SEL$mt_pid " mt_more=1 ;; esac
        done
    done
}
# nearest PATH: AT = PATH, or its nearest existing ancestor (/ at worst), and REST the part of
# PATH below it; AT_PHYS = AT's physical path, empty when it vanished meanwhile.
nearest() {
    AT=$1 REST=
    while [ ! -d "${AT:-/}" ]; do
        case $AT in */*) ;; *) AT=/$AT ;; esac
        REST=/${AT##*/}$REST
        AT=${AT%/*}
    done
    AT=${AT:-/} AT_PHYS=
    # shellcheck disable=SC2164 # a directory that vanished meanwhile: no physical path
    cd -P -- "$AT" 2>/dev/null && AT_PHYS=$PWD && cd /
}
# phys_glob GLOB: PHYS = GLOB with its directories before the first name with a wildcard (and
# before the last name) resolved physically, as far as they exist.
phys_glob() {
    ph_pre=${1%/*}
    case $ph_pre in *[*?[]*) ph_pre=${ph_pre%%[*?[]*} && ph_pre=${ph_pre%/*} ;; esac
    nearest "$ph_pre"
    PHYS=${AT_PHYS:-$AT}
    PHYS=${PHYS%/}$REST${1#"$ph_pre"}
}
# login: LOGIN = the login user's home (under sudo the operator's, not root's: `~/.nv` means theirs).
login() {
    LOGIN=
    [ -z "${SUDO_USER:-}" ] || [ "$SUDO_USER" = root ] || LOGIN=$(getent passwd "$SUDO_USER" 2>/dev/null | cut -d: -f6)
    LOGIN=${LOGIN:-${HOME:-}}
}
# paths: the login home, the places state may live in, and each --path's physical form and matches
# (with their owners: another user's hold on a match not theirs does not keep it, see decide.py).
# TARGETS: the matches' physical paths (a symlink is none: removing it pulls nothing from anyone).
paths() {
    login
    rec "home $LOGIN"
    rec "henv ${HOME:-}"
    for pt_l in tmp:/tmp vartmp:/var/tmp shm:/dev/shm home:"$LOGIN" cache:"$LOGIN/.cache" \
        nv:"$LOGIN/.nv" triton:"$LOGIN/.triton" henv:"${HOME:-}"; do
        [ -d "${pt_l#*:}" ] || continue
        real_path "${pt_l#*:}"
        rec "place ${pt_l%%:*} $REAL"
    done
    pt_g=0 pt_m=0
    set -f; IFS=$NL
    for pt_glob in $PATHS; do
        tilde "$pt_glob" "$LOGIN"
        pt_glob=$TILDE
        phys_glob "$pt_glob"
        rec "glob $pt_g $PHYS"
        set +f
        for pt_p in $pt_glob; do
            case $pt_p in . | .. | */. | */..) continue ;; esac
            ftype "$pt_p" || continue
            real_path "$pt_p"
            rec "path $pt_m $pt_g $FTYPE $pt_p"
            rec "real $pt_m $REAL"
            rec "owner $pt_m $(stat -c %u -- "$pt_p" 2>/dev/null)"
            [ "$FTYPE" = l ] || TARGETS="$TARGETS$REAL$NL"
            pt_m=$((pt_m + 1))
        done
        set -f
        pt_g=$((pt_g + 1))
    done
    IFS=$DEFAULT_IFS; set +f
}
# grep_lines STRINGS [GREP-ARGS...]: grep -F for the lines of STRINGS, given on fd 4, not as
# arguments: thousands of them never make its argument list too long.
grep_lines() {
    gl_s=$1 && shift
    grep -F -f /dev/fd/4 "$@" 4<<EOF
$(printf '%s\n' "$gl_s" | sed '/^$/d')
EOF
}
# holders: LINKS = the fd targets to look for: TCP listeners on --port, unix sockets bound inside
# a TARGET (a live DataLoader worker holds its /tmp/pymp-* only so), GPU devices, the TARGETS.
# Then the processes with such an fd, a cwd or mapping in a TARGET, or a TARGET in their
# environment (a live torchrun worker holds its /tmp/torchelastic_* only so) are recorded.
# A /proc/net file is read to its end: one read() of it (a seq_file) returns a page at most.
holders() {
    LINKS=
    if [ -n "$PORT" ]; then
        # sl local remote st ... inode: the inodes of the sockets listening (0A) on the port
        # shellcheck disable=SC2013 # awk's words: one inode each
        for hd_i in $(cat /proc/net/tcp /proc/net/tcp6 2>/dev/null |
            awk -v p=":$(printf '%04X' "$PORT")" '$2 ~ p "$" && $4 == "0A" { print $10 }'); do
            out "listen $PORT $hd_i"
            LINKS="${LINKS}socket:[$hd_i]$NL"
        done
    fi
    set -f; IFS=$NL
    if [ -n "$TARGETS" ]; then
        hd_out=$(grep_lines "$(printf '%s' "$TARGETS" | sed 's/^/ /')" /proc/net/unix 2>/dev/null)
        for hd_l in $hd_out; do
            IFS=$DEFAULT_IFS
            # shellcheck disable=SC2086 # Num RefCount Protocol Flags Type St Inode Path
            set -- $hd_l
            IFS=$NL
            [ "$#" -ge 8 ] && rec "unix $hd_l" && LINKS="${LINKS}socket:[$7]$NL"
        done
    fi
    [ -z "$GPUS" ] || LINKS="$LINKS/dev/nvidia$NL"
    set +f
    hd_out=''
    # /dev/null as an extra operand: ls prints a "PID/fd:" header even for a single process.
    # shellcheck disable=SC2010,SC2012 # ls -l is how all fd link targets come out in one read
    [ -z "$TARGETS$LINKS" ] ||
        hd_out=$(cd /proc && ls -ln /dev/null [0-9]*/cwd [0-9]*/fd 2>/dev/null |
            grep_lines "/fd:$NL$(printf '%s' "$TARGETS$LINKS" | sed 's/^/ -> /')")
    set -f
    hd_pid=
    for hd_l in $hd_out; do
        case $hd_l in
        *[0-9]/fd:) hd_pid=${hd_l%/fd:} ;;
        *' '[0-9]*/cwd' -> '*)
            hd_i=${hd_l%%/cwd' -> '*}
            hd_i=${hd_i##* }
            rec "cwd $hd_i ${hd_l#*' -> '}"
            sel "$hd_i"
            ;;
        *' -> '*)
            rec "fd $hd_pid ${hd_l#*' -> '}"
            sel "$hd_pid"
            ;;
        esac
    done
    IFS=$DEFAULT_IFS; set +f
    [ -n "$TARGETS" ] || return 0
    hd_out=$(cd /proc && grep_lines "$TARGETS" -H [0-9]*/maps 2>/dev/null)
    # the variables naming a TARGET, one `PID/environ:NAME=VALUE` line each, from collect's ENVS
    # (awk reads the TARGETS first, up to an empty line)
    hd_env=$(printf '%s\n%s\n' "$TARGETS" "$ENVS" | awk -F "$SOH" '
        !env { if ($0 == "") env = 1; else t[n++] = $0; next }
        { p = substr($1, 1, index($1, ":")); $1 = substr($1, length(p) + 1)
          for (i = 1; i <= NF; i++) for (j = 0; j < n; j++) if (index($i, t[j])) { print p $i; break } }')
    set -f; IFS=$NL
    for hd_l in $hd_out; do
        rec "map $hd_l"
        sel "${hd_l%%/*}"
    done
    for hd_l in $hd_env; do
        rec "env $hd_l"
        sel "${hd_l%%/*}"
    done
    IFS=$DEFAULT_IFS; set +f
}
# smi_apps: the nvidia-smi exit status of its compute-apps query and their pids (none: no `smi`).
smi_apps() {
    command -v nvidia-smi >/dev/null 2>&1 || return 0
    gp_out=$(timeout 60 nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>&1)
    out "smi $?"
    for gp_l in $gp_out; do
        case $gp_l in '' | *[!0-9]*) ;; *) out "app $gp_l" ;; esac
    done
    rec "smiout $(printf '%s' "$gp_out" | head -c 2000)"
}
# records: for each process of SEL, `p PID UID CUT CMDLINE` (the command line's first CMD_MAX
# bytes as hex; CUT 1: it was longer) and its comm; for one not root's, the program it runs and
# its parent's uids and comm (its name is its own to choose: decide.py believes a daemon's name
# only from root, or from that program started by a daemon of root's); the names of their users.
records() {
    [ "$SEL" != ' ' ] || return 0
    rc_uids=' ' rc_pars=' '
    # shellcheck disable=SC2086 # pids: word splitting wanted
    while read -r rc_pid rc_l _; do
        [ -n "$rc_l" ] || continue
        to_hex -N $((CMD_MAX + 1)) "/proc/$rc_pid/cmdline"
        rc_cut=0
        [ "${#HEX}" -le $((CMD_MAX * 2)) ] || HEX=${HEX%??} rc_cut=1
        out "p $rc_pid $rc_l $rc_cut $HEX"
        eval "rec \"comm $rc_pid \$C_$rc_pid\""
        if [ "$rc_l" != 0 ]; then
            rc_x=$(readlink "/proc/$rc_pid/exe" 2>/dev/null) && [ -n "$rc_x" ] && rec "exe $rc_pid $rc_x"
            eval "rc_x=\$PP_$rc_pid" && case $rc_pars in *" $rc_x "*) ;; *) rc_pars="$rc_pars$rc_x " ;; esac
        fi
        case $rc_uids in *" $rc_l "*) ;; *) rc_uids="$rc_uids$rc_l " ;; esac
    done <<EOF
$(uid_lines $SEL)
EOF
    # shellcheck disable=SC2086 # pids: word splitting wanted
    uid_lines $rc_pars | while read -r rc_pid rc_l; do eval "rec \"parent $rc_pid $rc_l \$C_$rc_pid\""; done
    # shellcheck disable=SC2086 # uids: word splitting wanted
    { getent passwd $rc_uids 2>/dev/null || cat /etc/passwd; } | while IFS=: read -r rc_n _ rc_u _; do
        case $rc_uids in *" $rc_u "*) rec "user $rc_u $rc_n" ;; esac
    done
}
# dir_check DIR: `dir TYPE PATH` for DIR (~: the login home); for a directory, `dirw RC [TEXT]` of
# a write probe, a file really created and removed (permission bits say nothing of a read-only mount,
# and root passes them all); then `dirat`, `dirreal` and `dirdf` of the nearest existing directory.
dir_check() {
    login
    tilde "$1" "$LOGIN"
    dc_d=$TILDE
    if [ -d "$dc_d" ]; then dc_t=d; elif [ -L "$dc_d" ] && [ ! -e "$dc_d" ]; then dc_t=l
    elif [ -e "$dc_d" ]; then dc_t=o; else dc_t=n; fi
    rec "dir $dc_t $dc_d"
    if [ "$dc_t" = d ]; then
        dc_p=${dc_d%/}/.fleet-preflight.$$
        if dc_e=$( (set -C && : >"$dc_p") 2>&1); then
            if rm -f -- "$dc_p" 2>/dev/null && [ ! -e "$dc_p" ]; then rec "dirw 0"; else rec "dirw 2 $dc_p"; fi
        else
            rec "dirw 1 ${dc_e##*: }"
        fi
    fi
    nearest "$dc_d"
    rec "dirat $AT"
    [ -z "$AT_PHYS" ] || rec "dirreal $AT_PHYS"
    df -Pk -- "$AT" 2>/dev/null | sed -n '2s/^/dirdf /p' | tr '\n' '\000'
}

# uid_lines PID...: `PID RUID EUID SUID FSUID` for each of those processes still there.
uid_lines() {
    for ul_p; do set -- "$@" "$ul_p/status" && shift; done
    (cd /proc && grep -H '^Uid:' /dev/null "$@" 2>/dev/null) | tr '\t:' '  ' |
        sed -n 's|^\([0-9][0-9]*\)/status Uid  *\([0-9]*\) \([0-9]*\) \([0-9]*\) \([0-9]*\).*|\1 \2 \3 \4 \5|p'
}
# trust: TRUST = this shell's uid and the login's (sudo's SUDO_UID; fleet's docker exec sets
# it empty), the uids whose marks count (decide.py's fleet_uids), and a `trust` line of them.
trust() {
    TRUST=$(awk '/^Uid:/ { print $3 }' "/proc/$$/status")
    case ${SUDO_UID:-} in '' | *[!0-9]*) TRUST=" $TRUST - " ;; *) TRUST=" $TRUST $SUDO_UID " ;; esac
    out "trust$TRUST"
}
# marks PIDS: `m PID RUID EUID SUID FSUID` for each process marked as a helper (MARK in its
# environment, which any user can put there); HELPERS = those whose uids are all in TRUST, whom
# match leaves out (their argv holds the patterns).
marks() {
    # shellcheck disable=SC2086 # pids: word splitting wanted
    while read -r mk_p mk_u; do
        out "m $mk_p $mk_u"
        for mk_i in $mk_u; do case $TRUST in *" $mk_i "*) ;; *) continue 2 ;; esac; done
        HELPERS="$HELPERS$mk_p "
    done <<EOF
$(uid_lines $1)
EOF
}
# collect: the facts; one read of every environment (ENVS) finds helpers (MARK) and TARGET namers.
collect() {
    scan
    { read -r sc_l </proc/sys/kernel/random/boot_id; } 2>/dev/null || sc_l=''; rec "boot $sc_l"
    SEL=' ' TARGETS='' HELPERS=' '
    trust
    [ -z "$PATHS" ] || paths
    set +f # environ globs /proc; its patterns on fd 4 (grep_lines' way)
    ENVS=$(environ -F -f /dev/fd/4 4<<EOF
$(printf '%s\n' "environ:$MARK" "$SOH$MARK" "$TARGETS" | sed '/^$/d')
EOF
    )
    set -f; IFS=$NL
    sc_m=''
    for sc_l in $ENVS; do
        case ${sc_l%%/*} in '' | *[!0-9]*) continue ;; esac # a value's own newline starts no record
        case $sc_l in *"environ:$MARK"* | *"$SOH$MARK"*) sc_m="$sc_m ${sc_l%%/*}" ;; esac
    done
    IFS=$DEFAULT_IFS; set +f
    [ -z "$sc_m" ] || marks "$sc_m"
    [ -z "$PATTERNS" ] || match
    holders
    [ -z "$GPUS" ] || smi_apps
    records
    [ -z "$MOUNTS" ] || sed 's/^/mount /' /proc/self/mounts | tr '\n' '\000'
    [ -z "$DIRCHK" ] || dir_check "$DIRCHK"
    df_i=0
    set -f; IFS=$NL
    for df_d in $DFS; do
        df -Pk -- "$df_d" 2>/dev/null | sed -n "2s|^|df $df_i |p" | tr '\n' '\000'
        df_i=$((df_i + 1))
    done
}
# gather ARGS: a function, so that the shell has read the whole script from stdin before its exec.
gather() {
    PATTERNS='' PATHS='' PORT='' GPUS='' MOUNTS='' DFS='' DIRCHK=''
    while [ "$#" -gt 0 ]; do
        case $1 in
        --gpus) GPUS=1 ;;
        --mounts) MOUNTS=1 ;;
        --pattern | --path | --port | --df | --dir-check)
            case ${2-} in '' | *"$NL"*) die_usage "$1 needs a value: one non-empty line" ;; esac
            case $1 in
            --pattern) PATTERNS=$PATTERNS$2$NL ;;
            --path) PATHS=$PATHS$2$NL ;;
            --df) DFS=$DFS$2$NL ;;
            --dir-check) case $2 in [!/~]*) DIRCHK=$PWD/$2 ;; *) DIRCHK=$2 ;; esac ;;
            *) case $2 in *[!0-9]*) die_usage "--port needs a number" ;; *) PORT=$2 ;; esac ;;
            esac
            shift
            ;;
        *) die_usage "unknown option: $1" ;;
        esac
        shift
    done
    exec </dev/null 3>&1 # the script itself arrives on stdin: keep children off it
    say "facts 1"
    say "self $$"
    # Text travels hex-encoded in `x` lines (fleet/node/facts.py), written once collect() is
    # done: its own lines go straight out and so never land in the middle of one of these.
    XHEX=$(collect | od -An -tx1 -v)
    printf '%s\n' "$XHEX" | sed -e 's/ //g' -e '/^$/d' -e 's/^/x /'
    say end
}

gather "$@"
