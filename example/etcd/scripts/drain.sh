#!/bin/sh
# The drain of an etcd member, run in its drain pod by `drainer exec -- sh drain.sh`.
#
# etcd keeps every key on every member, so nothing has to move: what must happen is that the
# cluster stops counting the removed member in its quorum. A 5-member cluster scaled to 3 that
# still lists 5 members needs 3 of its 3 live ones to agree, and the next single failure stops
# it; once the two are removed, 2 of 3 suffice. So this removes the member from the membership
# (`etcdctl member remove`, found by its peer URL, which is its stable DNS name) and exits 0
# only once a linearizable read of the membership no longer lists it. Then the claim is
# deleted, which matters too: etcd refuses to start on the data of a removed member.
#
# Idempotent: a member the cluster no longer lists (an earlier attempt removed it and died
# before exiting) is done at once. Exit 75 (retry after a backoff) when no live member answers.
set -u
. /scripts/lib.sh

ep=$(live_endpoint) || { log "no live member answers"; exit 75; }
# A membership read that fails, reads nothing, or is not this set's proves nothing: retry.
list=$(members "$ep") && ours "$list" || { log "cannot read the membership"; exit 75; }
id=$(echo "$list" | awk -F', ' -v url="$PEER_URL" '$4 == url {print $1}')
if [ -n "$id" ]; then
  log "removing member $NAME ($id) through $ep"
  etcdctl --endpoints="$ep" --command-timeout=10s member remove "$id" >/dev/null ||
    { log "member remove failed"; exit 75; }
  list=$(members "$ep") && ours "$list" || { log "cannot read the membership"; exit 75; }
fi
# The proof: the membership, read through the quorum, lists this set's members, and not this one.
if lists_me "$list"; then
  log "the cluster still lists $NAME"
  exit 75
fi
log "member $NAME is not in the cluster ($(echo "$list" | wc -l) members left)"
exit 0
