#!/bin/sh
# fleet/remote/janitor.sh: the checkpoint janitor on this node, as fleet feeds it:
#
#   sh -s -- start|stop|status|run-once [OPTIONS] < janitor.sh
#
# It runs janitor-loop.sh (actions, options and what is deleted: there) with these arguments and
# hands it its own text, which `start` copies into the janitor's state dir for the daemon to run.
# fleet:include janitor-loop.sh as JANITOR_LOOP
export JANITOR_LOOP
exec sh -c "$JANITOR_LOOP" janitor-loop.sh "$@"
