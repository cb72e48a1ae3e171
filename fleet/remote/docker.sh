#!/bin/sh
# fleet/remote/docker.sh: node-side helper for `fleet kill-docker` (playbooks/kill-docker.yaml).
#
# fleet runs it over SSH with the script on stdin, maybe under sudo and a deadline:
#
#     [timeout N] [sudo -n] sh -s -- kill --grace SECONDS --pattern ERE [--pattern ERE ...]
#         [--container NAME|ERE ...] [--label KEY=VALUE|KEY ...] [--image IMAGE ...] [--stop]
#
# Selection, from `docker ps -a`:
#   --container  a container's name, or an extended regex matched against the whole name
#                (anchored), or an id / id prefix when no name matches;
#   --label      the container carries label KEY (with value VALUE);
#   --image      the container runs IMAGE: repository:tag exactly ("latest" when the container's
#                image has no tag), or any tag of the repository when IMAGE has none.
#   Values of one option are alternatives (OR); different options must all hold (AND). Only
#   running containers are acted on. With none of the three options: every running container
#   that has a process matching a --pattern (checked inside it first, nothing is signalled).
#
# For each selected container, in parallel: the shipped cleanup.sh, included below as
# CLEANUP_SH, runs INSIDE the container with its `kill` action (`docker exec -i -u 0 C sh -s --
# kill ...`, the script on stdin): the same self-safe TERM -> grace -> KILL by pid as `fleet
# cleanup`. Killing a `docker exec` client does not kill what it started (docker/cli#5309,
# moby#35703; PITFALLS 6), so nothing here runs `docker exec pkill`. Every line it prints is
# relayed prefixed with "[NAME] ". With --stop the container is then stopped (`docker stop -t`
# with the grace rounded up: TERM to its main process, KILL when the time is up).
#
# Two things cleanup.sh cannot see from inside, checked before it and by a few lines sent ahead:
#   - a container sharing the host's PID namespace (`docker run --pid host`): cleanup there
#     would kill matching processes of the host and of every other container. Refused, on the
#     daemon's word (HostConfig.PidMode, one `docker inspect`), and also when the container's
#     PID namespace is this shell's. The daemon's word is needed when this shell is not in the
#     daemon's PID namespace (a node that is itself a container given the host's docker
#     socket): a --pid host container's namespace is not ours there, yet holds every process.
#   - a container whose pid 1 (its main process) matches: cleanup never kills pid 1, and
#     doing so ends the container. If it still runs after the kill, it is reported as left;
#     --stop is the way to end it.
#
# Outcomes (each on its own line; the LAST line is a one-line summary for fleet's live table):
#   kill-docker: skipped: docker not installed               exit 0 (1 if --container was given)
#   kill-docker: permission denied on the docker socket ...  exit 1
#   kill-docker: cannot reach the docker daemon ...          exit 1
#   no such container: NAME                                  exit 1
#   container not running: NAME (exited)                     exit 1
#   kill-docker: 2 containers: train-a killed 3, train-b nothing matched
#                                                            exit 0, or 1 if anything is left
#                                                            alive or could not be checked
#   exit 2: bad usage, with the reason on stderr.
#
# Portability: POSIX sh (dash, busybox ash, bash) with coreutils-level tools (grep, cut, tr,
# head, tail, mktemp, readlink); `docker` itself, run directly (the step runs under sudo when
# fleet is not root already).

LC_ALL=C
export LC_ALL
NL='
'
TAB=$(printf '\t')
DEFAULT_IFS=$IFS
MARK='fleet-docker:'
PS_FORMAT='{{.ID}}\t{{.Names}}\t{{.Image}}\t{{.State}}'

# The shipped cleanup.sh: fleet replaces the next line with `CLEANUP_SH=<its text>` when it sends
# this script (fleet/playbook.py, _with_includes).
# fleet:include cleanup.sh as CLEANUP_SH

usage() {
    cat <<'EOF'
usage: sh -s -- kill --grace SECONDS --pattern ERE [--pattern ERE ...]
    [--container NAME|ERE ...] [--label KEY=VALUE|KEY ...] [--image IMAGE ...] [--stop]
EOF
}

die_usage() {
    printf 'docker.sh: %s\n' "$1" >&2
    usage >&2
    exit 2
}

say() {
    printf '%s\n' "$*"
}

in_list() {
    case " $1 " in *" $2 "*) return 0 ;; esac
    return 1
}

# plural N WORD: "1 container", "2 containers".
plural() {
    if [ "$1" = 1 ]; then
        printf '1 %s' "$2"
    else
        printf '%s %ss' "$1" "$2"
    fi
}

# first_line FILE: the first non-empty line of FILE.
first_line() {
    grep -v '^[[:space:]]*$' "$1" 2>/dev/null | head -n 1
}

# ---------------------------------------------------------------- options

# check_pattern ERE: refuse what cleanup.sh would refuse, before touching any container.
check_pattern() {
    [ -n "$1" ] || die_usage "--pattern must not be empty (it would match every process)"
    case $1 in *"$NL"*) die_usage "--pattern must be a single line" ;; esac
    printf 'x\n' | grep -E -e "$1" >/dev/null 2>&1
    [ "$?" -ne 2 ] || die_usage "--pattern is not a valid extended regex: $1"
    if printf '\n' | grep -E -e "$1" >/dev/null 2>&1; then
        die_usage "--pattern '$1' matches the empty string, so it would match every process"
    fi
}

# check_value OPTION VALUE: one non-empty line.
check_value() {
    [ -n "$2" ] || die_usage "$1 must not be empty"
    case $2 in *"$NL"*) die_usage "$1 must be a single line" ;; esac
}

parse_args() {
    [ "$#" -gt 0 ] || die_usage "missing action"
    case $1 in
    -h | --help | help)
        usage
        exit 0
        ;;
    kill) shift ;;
    *) die_usage "unknown action: $1" ;;
    esac
    PATTERNS='' CONTAINERS='' LABELS='' IMAGES='' GRACE=10 STOP=0
    while [ "$#" -gt 0 ]; do
        case $1 in
        -h | --help)
            usage
            exit 0
            ;;
        --stop)
            STOP=1
            shift
            continue
            ;;
        --pattern | --container | --label | --image | --grace) ;;
        *) die_usage "unknown option for kill: $1" ;;
        esac
        [ "$#" -ge 2 ] || die_usage "$1 needs a value"
        case $1 in
        --pattern)
            check_pattern "$2"
            PATTERNS="$PATTERNS$2$NL"
            ;;
        --container)
            check_value "$1" "$2"
            printf 'x\n' | grep -E -x -e "$2" >/dev/null 2>&1
            [ "$?" -ne 2 ] || die_usage "--container is neither a name nor a valid extended regex: $2"
            CONTAINERS="$CONTAINERS$2$NL"
            ;;
        --label)
            check_value "$1" "$2"
            case $2 in =*) die_usage "--label needs KEY or KEY=VALUE, got: $2" ;; esac
            LABELS="$LABELS$2$NL"
            ;;
        --image)
            check_value "$1" "$2"
            case $2 in *[[:space:]]*) die_usage "--image must not contain spaces: $2" ;; esac
            IMAGES="$IMAGES$2$NL"
            ;;
        --grace)
            case $2 in '' | . | *[!0-9.]* | *.*.*) die_usage "--grace needs seconds (e.g. 10 or 0.5), got: $2" ;; esac
            GRACE=$2
            ;;
        esac
        shift 2
    done
    [ -n "$PATTERNS" ] || die_usage "kill needs at least one --pattern"
    # docker stop takes whole seconds: the grace rounded up.
    STOP_S=${GRACE%%.*}
    STOP_S=${STOP_S:-0}
    case $GRACE in *.*[1-9]*) STOP_S=$((STOP_S + 1)) ;; esac
    SELECTORS="$CONTAINERS$LABELS$IMAGES"
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

# ---------------------------------------------------------------- docker

# docker_failed WHAT RC: explain a failed docker command (its stderr is in $TMP/err), exit 1.
docker_failed() {
    df_msg=$(first_line "$TMP/err")
    [ -z "$df_msg" ] || say "$1: $df_msg"
    case $(printf '%s' "$df_msg" | tr '[:upper:]' '[:lower:]') in
    *'permission denied'*)
        say "kill-docker: permission denied on the docker socket (run with sudo or join the docker group)"
        ;;
    *'cannot connect to the docker daemon'* | *'is the docker daemon running'*)
        say "kill-docker: cannot reach the docker daemon (is it running?)"
        ;;
    *) say "kill-docker: $1 failed (exit $2)" ;;
    esac
    exit 1
}

# load_containers: N containers (running or not) as ID_i NAMES_i NAME_i IMAGE_i STATE_i.
load_containers() {
    lc_out=$(docker ps -a --no-trunc --format "$PS_FORMAT" 2>"$TMP/err")
    lc_rc=$?
    [ "$lc_rc" -eq 0 ] || docker_failed "docker ps" "$lc_rc"
    N=0
    : >"$TMP/names"
    : >"$TMP/index"
    # shellcheck disable=SC2034  # lc_image and lc_state are read by the eval below
    while IFS=$TAB read -r lc_id lc_names lc_image lc_state; do
        [ -n "$lc_id" ] || continue
        N=$((N + 1))
        eval "ID_$N=\$lc_id NAMES_$N=\$lc_names IMAGE_$N=\$lc_image STATE_$N=\$lc_state"
        eval "NAME_$N=\${lc_names%%,*}"
        # One line per name (legacy links give a container several), and which container it is.
        IFS=,
        for lc_name in $lc_names; do
            printf '%s\n' "$lc_name" >>"$TMP/names"
            printf '%s\n' "$N" >>"$TMP/index"
        done
        IFS=$DEFAULT_IFS
    done <<EOF
$lc_out
EOF
}

# container_hits VALUE: HITS = containers whose name is VALUE or matches it as an anchored ERE,
# else whose id starts with VALUE.
container_hits() {
    HITS=''
    ch_lines=$(grep -n -E -x -e "$1" "$TMP/names" 2>/dev/null | cut -d: -f1 | tr '\n' ' ')
    for ch_line in $ch_lines; do
        ch_i=$(sed -n "${ch_line}p" "$TMP/index")
        in_list "$HITS" "$ch_i" || HITS="$HITS $ch_i"
    done
    [ -z "$HITS" ] || return 0
    case $1 in *[!0-9a-f]*) return 0 ;; esac
    ch_i=0
    while [ "$ch_i" -lt "$N" ]; do
        ch_i=$((ch_i + 1))
        ch_id=''
        eval "ch_id=\$ID_$ch_i"
        case $ch_id in "$1"*) HITS="$HITS $ch_i" ;; esac
    done
}

# label_ids: LABEL_IDS = ids of the containers carrying any --label (docker does the matching).
label_ids() {
    LABEL_IDS=' '
    set -f
    IFS=$NL
    for li_label in $LABELS; do
        IFS=$DEFAULT_IFS
        li_out=$(docker ps -a --no-trunc --filter "label=$li_label" --format '{{.ID}}' 2>"$TMP/err")
        li_rc=$?
        [ "$li_rc" -eq 0 ] || docker_failed "docker ps --filter label=$li_label" "$li_rc"
        for li_id in $li_out; do
            in_list "$LABEL_IDS" "$li_id" || LABEL_IDS="$LABEL_IDS$li_id "
        done
    done
    IFS=$DEFAULT_IFS
    set +f
}

# split_image REF: REPO and TAG of an image reference (no digest; docker.io/library/ dropped).
split_image() {
    si_ref=${1%%@*}
    si_ref=${si_ref#docker.io/}
    si_ref=${si_ref#library/}
    case ${si_ref##*/} in
    *:*)
        TAG=${si_ref##*:}
        REPO=${si_ref%:*}
        ;;
    *)
        TAG=''
        REPO=$si_ref
        ;;
    esac
}

# image_matches ACTUAL: the container image ACTUAL is one of the --image values.
image_matches() {
    split_image "$1"
    im_repo=$REPO im_tag=${TAG:-latest}
    set -f
    IFS=$NL
    for im_want in $IMAGES; do
        IFS=$DEFAULT_IFS
        if [ "$im_want" = "$1" ]; then
            set +f
            return 0
        fi
        split_image "$im_want"
        if [ "$REPO" = "$im_repo" ] && { [ -z "$TAG" ] || [ "$TAG" = "$im_tag" ]; }; then
            set +f
            return 0
        fi
    done
    IFS=$DEFAULT_IFS
    set +f
    return 1
}

# ---------------------------------------------------------------- selection

# select_containers: SELECTED = indices of the running containers to act on; PROBLEMS = lines
# about named containers that are missing or not running.
select_containers() {
    PROBLEMS='' NAMED=' '
    if [ -n "$CONTAINERS" ]; then
        set -f
        IFS=$NL
        for sc_value in $CONTAINERS; do
            IFS=$DEFAULT_IFS
            container_hits "$sc_value"
            if [ -z "$HITS" ]; then
                PROBLEMS="${PROBLEMS}no such container: $sc_value$NL"
                continue
            fi
            sc_running=''
            for sc_i in $HITS; do
                sc_state=''
                eval "sc_state=\$STATE_$sc_i"
                [ "$sc_state" != running ] || sc_running="$sc_running $sc_i"
            done
            if [ -z "$sc_running" ]; then
                for sc_i in $HITS; do
                    eval "PROBLEMS=\"\${PROBLEMS}container not running: \$NAME_$sc_i (\$STATE_$sc_i)\$NL\""
                done
                continue
            fi
            for sc_i in $sc_running; do
                in_list "$NAMED" "$sc_i" || NAMED="$NAMED$sc_i "
            done
        done
        IFS=$DEFAULT_IFS
        set +f
    fi
    [ -z "$LABELS" ] || label_ids
    SELECTED=''
    sc_i=0
    while [ "$sc_i" -lt "$N" ]; do
        sc_i=$((sc_i + 1))
        sc_state='' sc_id='' sc_image=''
        eval "sc_state=\$STATE_$sc_i sc_id=\$ID_$sc_i sc_image=\$IMAGE_$sc_i"
        [ "$sc_state" = running ] || continue
        if [ -n "$CONTAINERS" ]; then in_list "$NAMED" "$sc_i" || continue; fi
        if [ -n "$LABELS" ]; then in_list "$LABEL_IDS" "$sc_id" || continue; fi
        if [ -n "$IMAGES" ]; then image_matches "$sc_image" || continue; fi
        SELECTED="$SELECTED $sc_i"
    done
}

# pid_modes: HOSTPID_i=1 for each selected container the daemon runs in its host's PID
# namespace (`docker run --pid host`). Asked once for all of them; a container that vanished
# since `docker ps` is simply not marked (its docker exec then fails and says so).
pid_modes() {
    pm_ids=''
    for pm_i in $SELECTED; do
        eval "pm_ids=\"\$pm_ids \$ID_$pm_i\""
    done
    [ -n "$pm_ids" ] || return 0
    # shellcheck disable=SC2086  # ids: word splitting wanted
    pm_out=$(docker inspect --type container --format '{{.Id}} {{.HostConfig.PidMode}}' \
        $pm_ids 2>/dev/null)
    while read -r pm_id pm_mode; do
        [ "$pm_mode" = host ] || continue
        for pm_i in $SELECTED; do
            pm_this=''
            eval "pm_this=\$ID_$pm_i"
            [ "$pm_this" != "$pm_id" ] || eval "HOSTPID_$pm_i=1"
        done
    done <<EOF
$pm_out
EOF
}

# ---------------------------------------------------------------- inside a container

# prologue: shell lines sent ahead of cleanup.sh into the container. They refuse to go on in
# the node's own PID namespace and report the container's pid 1. They read nothing from stdin
# (the rest of stdin is cleanup.sh itself).
prologue() {
    # shellcheck disable=SC2016  # shell text for the container: expanded there, not here
    printf '%s\n' \
        'fleet_ns=$(readlink /proc/self/ns/pid 2>/dev/null) || fleet_ns=' \
        "if [ -n \"\$fleet_ns\" ] && [ \"\$fleet_ns\" = '$HOST_NS' ]; then" \
        "    echo '$MARK host-pid-namespace'" \
        '    exit 3' \
        'fi' \
        "printf '$MARK pid1 %s\\n' \"\$(tr '\\000\\n' '  ' </proc/1/cmdline 2>/dev/null)\""
}

# relay NAME FILE SHOW: copy stdin to FILE; print each line as "[NAME] line" when SHOW is 1,
# except our own marker lines.
relay() {
    while IFS= read -r rl_line || [ -n "$rl_line" ]; do
        printf '%s\n' "$rl_line" >&3
        [ "$3" = 1 ] || continue
        case $rl_line in "$MARK"*) continue ;; esac
        printf '[%s] %s\n' "$1" "$rl_line"
    done 3>"$2"
}

# in_container I SHOW ACTION [ARG...]: run cleanup.sh ACTION inside container I. Output goes to
# $TMP/out.I (and, prefixed, to stdout when SHOW is 1); sets RC, REFUSED (it shares the host's
# PID namespace) and PID1 (the container's pid 1 command line).
in_container() {
    ic_i=$1 ic_show=$2
    shift 2
    ic_id='' ic_name='' ic_hostpid=''
    eval "ic_id=\$ID_$ic_i ic_name=\$NAME_$ic_i ic_hostpid=\${HOSTPID_$ic_i-}"
    if [ -n "$ic_hostpid" ]; then
        # Nothing runs in there, not even the prologue (whose namespace comparison cannot tell
        # when this shell is not in the daemon's PID namespace).
        RC=3 REFUSED=1 PID1=''
        printf '%s\n' "$MARK host-pid-namespace" >"$TMP/out.$ic_i"
        return 0
    fi
    set -f
    IFS=$NL
    for ic_pat in $PATTERNS; do
        set -- "$@" --pattern "$ic_pat"
    done
    IFS=$DEFAULT_IFS
    set +f
    # The group's own stderr is dropped: the shell would report a docker exec killed by a signal
    # (the container ended under it) as "Killed" there; docker's messages go to the relay.
    {
        {
            prologue
            printf '%s\n' "$CLEANUP_SH"
        } | docker exec -i -u 0 "$ic_id" sh -s -- "$@" 2>&1
        printf '%s\n' "$?" >"$TMP/rc.$ic_i"
    } 2>/dev/null | relay "$ic_name" "$TMP/out.$ic_i" "$ic_show"
    RC=$(cat "$TMP/rc.$ic_i" 2>/dev/null)
    RC=${RC:-125}
    REFUSED=''
    grep -q -x -F -e "$MARK host-pid-namespace" "$TMP/out.$ic_i" && REFUSED=1
    PID1=$(grep "^$MARK pid1 " "$TMP/out.$ic_i" | head -n 1)
    PID1=${PID1#"$MARK pid1 "}
    PID1=${PID1%"${PID1##*[! ]}"}
}

# pid1_matches: the container's pid 1 (from in_container) matches a --pattern.
pid1_matches() {
    [ -n "$PID1" ] && printf '%s\n' "$PID1" | grep_patterns -q
}

# container_state ID: STATE = the container's state now ("gone" if docker no longer lists it).
container_state() {
    STATE=$(docker ps -a --no-trunc --format "$PS_FORMAT" 2>/dev/null | grep "^$1$TAB" | cut -f4)
    STATE=${STATE:-gone}
}

# settle ID POLLS: STATE = the container's state, polled (POLLS times, 0.2 s apart) while it
# still says "running".
# The daemon learns that a container ended only once every process in it is gone and reaped,
# which may take a moment after our own docker exec was killed with the rest (a process stuck
# in an uninterruptible driver call holds it up): until then `docker ps` says running.
settle() {
    container_state "$1"
    st_polls=0
    while [ "$STATE" = running ] && [ "$st_polls" -lt "$2" ]; do
        sleep 0.2
        st_polls=$((st_polls + 1))
        container_state "$1"
    done
}

# probe I: is container I worth a kill (default selection)? Writes "yes", "no" or "skip WHY: ..."
# to $TMP/probe.I. Nothing is signalled: cleanup.sh's verify only lists.
probe() {
    in_container "$1" 0 verify
    if [ -n "$REFUSED" ]; then
        pr_result="skip host PID namespace: it shares the host's (docker run --pid host), so its processes are the host's: see fleet cleanup"
    elif [ "$RC" = 1 ] || pid1_matches; then
        pr_result=yes
    elif [ "$RC" = 0 ]; then
        pr_result=no
    else
        pr_result="skip cannot run sh: docker exec exit $RC: $(grep -v "^$MARK" "$TMP/out.$1" | tail -n 1)"
    fi
    printf '%s\n' "$pr_result" >"$TMP/probe.$1"
}

# work I: kill in container I, check its pid 1, stop it with --stop. Writes "FAILED<TAB>TEXT"
# to $TMP/result.I (FAILED is 1 when something may be left alive).
work() {
    wk_i=$1
    wk_id='' wk_name=''
    eval "wk_id=\$ID_$wk_i wk_name=\$NAME_$wk_i"
    in_container "$wk_i" 1 kill --grace "$GRACE"
    wk_failed=0 wk_ended=''
    wk_last=$(grep '^kill: ' "$TMP/out.$wk_i" | tail -n 1)
    if [ -n "$REFUSED" ]; then
        say "[$wk_name] refused: the container shares the host's PID namespace (docker run --pid host): a kill there would hit the host and every container; use fleet cleanup"
        wk_text="refused (host PID namespace)"
        wk_failed=1
    elif [ "$RC" = 0 ] && [ "$wk_last" = "kill: nothing matched" ]; then
        wk_text="nothing matched"
    elif [ "$RC" = 0 ] && [ -n "$wk_last" ]; then
        wk_n=${wk_last#kill: }
        wk_text="killed ${wk_n%% *}"
    elif [ "$RC" = 1 ] && [ -n "$wk_last" ]; then
        wk_n=${wk_last#kill: }
        wk_text="left ${wk_n%% *}"
        wk_failed=1
    else
        # A docker exec killed by a signal (137: KILL) is what the container's end does to it:
        # then wait up to 5 s (cleanup.sh's own wait for a KILL to take effect) to be told.
        case $RC in 1[3-9]?) settle "$wk_id" 25 ;; *) container_state "$wk_id" ;; esac
        if [ "$STATE" = running ]; then
            say "[$wk_name] kill did not run to the end (exit $RC): no sh in the container, or docker exec failed"
            wk_text="kill failed (exit $RC)"
            wk_failed=1
        else
            # The main process ended (its training child was killed), so the container stopped,
            # and docker ended everything in it, our exec too.
            say "[$wk_name] container $STATE during the kill: its main process ended"
            wk_text="container $STATE"
            wk_ended=1
        fi
    fi
    if [ -z "$REFUSED$wk_ended" ] && [ "$STOP" = 0 ] && pid1_matches; then
        # cleanup.sh never kills pid 1; a parent like docker-init or `sh -c` exits by itself once
        # its training child is gone, which ends the container. Give it a moment (2 s).
        settle "$wk_id" 10
        if [ "$STATE" = running ]; then
            say "[$wk_name] left: pid 1 (the container's main process) matches and is never killed here: $PID1; stop the container with --stop"
            wk_text="$wk_text, pid 1 left"
            wk_failed=1
        else
            say "[$wk_name] container $STATE: its main process ended"
            wk_text="$wk_text, container $STATE"
        fi
    fi
    if [ "$STOP" = 1 ] && [ -z "$wk_ended" ]; then
        if wk_err=$(docker stop -t "$STOP_S" "$wk_id" 2>&1 >/dev/null); then
            say "[$wk_name] stopped"
            wk_text="$wk_text, stopped"
            wk_failed=0 # nothing is left alive in a stopped container
        else
            say "[$wk_name] stop failed: $(printf '%s\n' "$wk_err" | grep -v '^[[:space:]]*$' | head -n 1)"
            wk_text="$wk_text, stop failed"
            wk_failed=1
        fi
    fi
    printf '%s\t%s %s\n' "$wk_failed" "$wk_name" "$wk_text" >"$TMP/result.$wk_i"
}

# ---------------------------------------------------------------- main

kill_docker() {
    if ! command -v docker >/dev/null 2>&1; then
        if [ -n "$CONTAINERS" ]; then
            say "kill-docker: docker not installed, but containers were named: $(printf '%s' "$CONTAINERS" | paste -s -d ' ' -)"
            return 1
        fi
        say "kill-docker: skipped: docker not installed"
        return 0
    fi
    HOST_NS=$(readlink /proc/self/ns/pid 2>/dev/null)
    load_containers
    select_containers
    pid_modes
    kd_failed=0
    if [ -n "$PROBLEMS" ]; then
        printf '%s' "$PROBLEMS"
        kd_failed=1
    fi
    if [ -z "$SELECTORS" ]; then
        # Default selection: the running containers with a matching process, checked in parallel.
        for kd_i in $SELECTED; do
            probe "$kd_i" &
        done
        wait
        kd_keep='' SKIPPED=''
        for kd_i in $SELECTED; do
            kd_name=''
            eval "kd_name=\$NAME_$kd_i"
            kd_probe=$(cat "$TMP/probe.$kd_i" 2>/dev/null)
            case $kd_probe in
            yes) kd_keep="$kd_keep $kd_i" ;;
            no) say "[$kd_name] no matching process" ;;
            *)
                # Not a failure: such a container is no place a training run would be killed
                # from; the line says why, and the summary names it.
                kd_why=${kd_probe#skip }
                say "[$kd_name] skipped: $kd_why"
                SKIPPED="$SKIPPED, $kd_name (${kd_why%%:*})"
                ;;
            esac
        done
        # shellcheck disable=SC2086  # indices: word splitting wanted
        set -- $SELECTED
        kd_running=$#
        SELECTED=$kd_keep
    fi
    for kd_i in $SELECTED; do
        work "$kd_i" &
    done
    wait
    kd_parts=''
    kd_count=0
    for kd_i in $SELECTED; do
        kd_count=$((kd_count + 1))
        kd_result=$(cat "$TMP/result.$kd_i" 2>/dev/null)
        if [ -z "$kd_result" ]; then
            eval "kd_result=\"1\$TAB\$NAME_$kd_i no result\""
        fi
        [ "${kd_result%%"$TAB"*}" = 0 ] || kd_failed=1
        kd_parts="$kd_parts, ${kd_result#*"$TAB"}"
    done
    if [ "$kd_count" -gt 0 ]; then
        kd_summary="kill-docker: $(plural "$kd_count" container): ${kd_parts#, }"
    elif [ -n "$PROBLEMS" ]; then
        kd_summary="kill-docker: nothing killed"
    elif [ -z "$SELECTORS" ]; then
        kd_summary="kill-docker: no running container has a matching process ($kd_running running)"
    else
        kd_summary="kill-docker: no running container matches the selection"
    fi
    [ -z "${SKIPPED:-}" ] || kd_summary="$kd_summary; skipped ${SKIPPED#, }"
    if [ -n "$PROBLEMS" ]; then
        kd_summary="$kd_summary; $(printf '%s' "$PROBLEMS" | sed 's/$/;/' | tr '\n' ' ')"
        kd_summary=${kd_summary%; }
    fi
    say "$kd_summary"
    return "$kd_failed"
}

main() {
    exec </dev/null # the script itself arrives on stdin: keep children off it
    parse_args "$@"
    if [ -z "${CLEANUP_SH:-}" ]; then
        say "docker.sh: cleanup.sh is not included (run it through fleet)" >&2
        exit 2
    fi
    TMP=$(mktemp -d "${TMPDIR:-/tmp}/fleet-kill-docker.XXXXXX") || {
        say "kill-docker: cannot create a temporary directory" >&2
        exit 1
    }
    trap 'rm -rf "$TMP"' EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    kill_docker
}

main "$@"; exit "$?"
