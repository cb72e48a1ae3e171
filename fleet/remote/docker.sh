#!/bin/sh
# fleet/remote/docker.sh: the docker CLI's part of `fleet kill-docker`. fleet decides what to
# select and kill (fleet/node/docker.py); the kill inside a container is facts.sh and act.sh, run
# there with `docker exec`. docker's own messages go to stderr.
#
#   sh -s -- list              every container, newest first, one JSON array per line: [id, name,
#                              image, state, PID mode, labels, restart count, restart policy];
#                              `no-docker` without a docker command; exit 1 when docker ps fails
#   sh -s -- state ID POLLS    `STATE RESTARTS` of ID (`gone` once docker no longer knows it),
#                              asked again every 0.2 s, at most POLLS times, while it is `running`
#   sh -s -- stop SECONDS ID   docker stop -t SECONDS ID
# shellcheck disable=SC2034 # read by die_usage (lib.sh)
SCRIPT=docker.sh
# fleet:source lib.sh
FORMAT='[{{json .Id}},{{json .Name}},{{json .Config.Image}},{{json .State.Status}},'
FORMAT=$FORMAT'{{json .HostConfig.PidMode}},{{json .Config.Labels}},{{json .RestartCount}},'
FORMAT=$FORMAT'{{json .HostConfig.RestartPolicy.Name}}]'

list() {
    command -v docker >/dev/null 2>&1 || { say no-docker && return 0; }
    ls_ids=$(docker ps -a -q --no-trunc) || return 1
    # A container removed since docker ps is left out (and docker says so on stderr).
    # shellcheck disable=SC2086 # the ids: word splitting wanted
    [ -z "$ls_ids" ] || docker inspect --type container --format "$FORMAT" $ls_ids || :
}
state() {
    st_n=0
    while st=$(docker inspect --type container --format '{{.State.Status}} {{.RestartCount}}' \
        "$1" 2>/dev/null) || st=gone
        [ "${st% *}" = running ] && [ "$st_n" -lt "$2" ]; do
        sleep 0.2
        st_n=$((st_n + 1))
    done
    say "$st"
}
# the script itself arrives on stdin: keep children off it (on the case, which is read whole first)
case ${1-}:$# in
list:1) list ;;
state:3) case $3 in '' | *[!0-9]*) die_usage "state: POLLS must be a number" ;; *) state "$2" "$3" ;; esac ;;
stop:3) docker stop -t "$2" -- "$3" >/dev/null ;;
*) die_usage "usage: sh -s -- list | state ID POLLS | stop SECONDS ID" ;;
esac </dev/null
