#!/bin/sh
# An etcd member: the entry point of the StatefulSet's pods (busybox sh). Every path ends in
# `exec etcd`, with the member's data on its claim (/data/etcd).
#   - A member with data starts as itself (its peers know it by name, whatever its new IP).
#   - A member with data that the cluster no longer lists (its drain removed it, then a scale-up
#     brought it back before its claim was deleted) cannot start on that data: etcd refuses the
#     data of a removed member. The data is a replica of what the cluster still holds, so it is
#     set aside and the member joins as new.
#   - A new member joins the live cluster (`member add`, unless the cluster already lists it).
#   - With no live cluster at all, the first INITIAL_MEMBERS ordinals found it together.
set -u
. /scripts/lib.sh
DATA=/data/etcd
ordinal=${NAME##*-}

run() {
  exec etcd --name "$NAME" --data-dir "$DATA" \
    --listen-peer-urls http://0.0.0.0:2380 --listen-client-urls http://0.0.0.0:2379 \
    --initial-advertise-peer-urls "$PEER_URL" --advertise-client-urls "$CLIENT_URL" \
    --strict-reconfig-check "$@"
}

join() {
  ep=$1
  list=$(members "$ep") && ours "$list" || return 1
  if ! lists_me "$list"; then
    log "joining the cluster through $ep"
    etcdctl --endpoints="$ep" member add "$NAME" --peer-urls="$PEER_URL" >/dev/null || return 1
    list=$(members "$ep") || return 1
  fi
  # Every member by name=peer URL; a member not started yet has no name: its name is its host's.
  initial=$(echo "$list" | awk -F', ' '{url = $4; host = url; sub(/^http:\/\//, "", host); sub(/\..*/, "", host); print host "=" url}' | paste -sd, -)
  log "starting as a member of $initial"
  run --initial-cluster "$initial" --initial-cluster-state existing
}

# A member has data once etcd wrote its WAL. A start that failed before that (its
# --initial-cluster read before another new member was added: etcd refuses a list that differs
# from the cluster's) leaves $DATA/member without a WAL: that is no data, and such a member
# joins (the cluster lists it already, so it is not added twice).
has_data() {
  for f in "$DATA"/member/wal/*.wal; do [ -f "$f" ] && return 0; done
  return 1
}

if has_data; then
  # Only a membership actually read, and not listing it, sets the data aside.
  if ep=$(live_endpoint) && list=$(members "$ep") && ours "$list" && ! lists_me "$list"; then
    log "the cluster no longer lists $NAME: setting the data of the removed member aside"
    rm -rf "$DATA.removed" && mv "$DATA" "$DATA.removed"
  else
    log "starting on the member's data"
    run
  fi
fi

while :; do
  ep=$(live_endpoint)
  found=$?
  if [ "$found" = 0 ]; then
    join "$ep"
    log "joining failed; trying again"
  elif [ "$found" = 2 ]; then
    # Not knowing who is there is no reason to found a cluster.
    log "the members cannot be looked up in cluster DNS yet"
  elif [ "$ordinal" -lt "${INITIAL_MEMBERS:?}" ]; then
    initial=""
    i=0
    while [ "$i" -lt "$INITIAL_MEMBERS" ]; do
      initial="$initial${initial:+,}$SET-$i=http://$SET-$i.$DOMAIN:2380"
      i=$((i + 1))
    done
    log "no live cluster: founding one as $initial"
    run --initial-cluster "$initial" --initial-cluster-state new \
      --initial-cluster-token "$POD_NAMESPACE-$SET"
  else
    log "no live cluster to join yet"
  fi
  sleep 2
done
