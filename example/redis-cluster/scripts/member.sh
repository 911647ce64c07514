#!/bin/sh
# A member of the Redis Cluster: the entry point of the StatefulSet's pods (busybox sh).
#
# It starts redis-server on its claim and makes sure the node is a working master of the
# cluster before it says it is Ready (the readiness probe looks for /tmp/ready), so that, with
# OrderedReady, members join one at a time:
#   - a pod that comes back (a restart, a cancelled scale-down) tells the others its new address;
#   - a new, empty node joins; the first one of a new cluster (ordinal 0, nobody else serving
#     anything) takes every slot;
#   - then slots are rebalanced so that empty masters get their share (a scale-up), and a
#     migration an interrupted drain left half done is finished first.
set -u
. /scripts/lib.sh

trap 'log "stopping"; kill -TERM "$REDIS_PID" 2>/dev/null; wait "$REDIS_PID"; exit 0' TERM INT
start_redis || exit 1
log "redis-server up as node $(cli cluster myid) at $POD_IP"
# A member back on the claim of a drain that handed over every slot and was then cancelled may
# have been made a replica (lib.sh, is_replica): it holds nothing of its own, so it forgets the
# cluster and joins again below as an empty master, which the rebalance gives its share.
if is_replica; then
  log "this node is a replica of a member that took its slots: joining again as an empty master"
  cli cluster reset soft >/dev/null || exit 1
fi
announce

# Found a cluster, or join the one the other members serve.
peer=""
while :; do
  for ip in $(member_ips); do
    # A member that answers, with slots assigned (no answer is not a cluster).
    n=$(rcli "$ip" cluster info 2>/dev/null | tr -d '\r' | awk -F: '/cluster_slots_assigned/ {print $2}')
    if [ -n "$n" ] && [ "$n" -gt 0 ] 2>/dev/null; then
      peer=$ip
      break
    fi
  done
  [ -n "$peer" ] && break
  if [ "${HOSTNAME##*-}" = 0 ]; then
    [ "$(slots_of)" -gt 0 ] || { log "founding the cluster: every slot here"; cli cluster addslotsrange 0 16383 >/dev/null; }
    peer=$POD_IP
    break
  fi
  log "no member serves any slot yet; waiting for ordinal 0 to found the cluster"
  sleep 2 &
  wait $!
done

if [ "$peer" != "$POD_IP" ]; then
  # Meeting the cluster is joining it (as an empty master if this node is new). Rebalance only
  # once the cluster knows this node, or it would balance the others without it.
  me=$(cli cluster myid)
  cli cluster meet "$peer" "$PORT" >/dev/null
  tries=0
  until rcli "$peer" cluster nodes 2>/dev/null | grep -q "^$me .* connected"; do
    tries=$((tries + 1))
    [ "$tries" -le 120 ] || { log "$peer does not see this node after a minute; restarting"; exit 1; }
    # Met again every 5 s: a member may have forgotten this node as it came back (above).
    [ $((tries % 10)) != 0 ] || cli cluster meet "$peer" "$PORT" >/dev/null 2>&1 || true
    sleep 0.5
  done
  settle "$peer" || exit 1
  tries=0
  while :; do
    log "rebalancing: empty masters take their share"
    if out=$(redis-cli --cluster rebalance "$peer:$PORT" --cluster-use-empty-masters 2>&1) &&
      [ "$(slots_of)" -gt 0 ]; then
      break
    fi
    log "rebalance did not finish: $(echo "$out" | grep -v '^#' | tail -n 2 | tr '\n' ' ')"
    tries=$((tries + 1))
    [ "$tries" -lt 10 ] || { log "giving up after $tries rebalances; restarting"; exit 1; }
    settle "$peer" || exit 1
  done
fi
touch /tmp/ready
log "ready: serving $(slots_of) slots"

# Ghosts. Every node forgets a drained member as its drain ends (drain.sh), but Redis bans a
# forgotten node for 60 s only: a node that still knew it then (a drain pod started later from
# a claim whose nodes.conf lists it, a FORGET that did not reach one node) gossips it back
# afterwards, and the members list it again, failed and serving no slot, for good. So each
# member forgets such nodes itself: a node the cluster agreed has failed and that serves no
# slot holds nothing of the cluster's. Only one seen so on two looks 5 s apart: a node that is
# coming back at a new address is failed here only until its first answer; and one that does
# come back meets the members again until they know it (above; drain.sh step 3).
forget_ghosts() {
  seen=""
  while sleep 5; do
    now=$(cli cluster nodes 2>/dev/null |
      awk 'NF == 8 && $3 ~ /(^|,)fail(,|$)/ && $3 !~ /myself/ {print $1}')
    for id in $now; do
      case " $seen " in *" $id "*) ;; *) continue ;; esac
      log "forgetting node $id: failed, serving no slot"
      cli cluster forget "$id" >/dev/null 2>&1 || true
    done
    seen=$(echo $now)
  done
}
forget_ghosts &
wait "$REDIS_PID"
