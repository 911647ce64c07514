# Shared by member.sh (the StatefulSet's pods) and drain.sh (the drain pods): sourced, busybox sh.
# Every step here is safe to repeat: a pod may die at any instant and run it all again.

PORT=6379
DATA=/data
# The members' names: the headless Service publishes every member, Ready or not
# (publishNotReadyAddresses), and never a drain pod (its labels are not the Service's).
MEMBERS=${SERVICE_NAME:?}.${POD_NAMESPACE:?}.svc.cluster.local

log() { echo "$(date -u +%H:%M:%S) $*" >&2; }

# cli ARGS...: redis-cli against the local node; rcli HOST ARGS...: against another.
cli() { redis-cli -p "$PORT" "$@"; }
rcli() { h=$1; shift; redis-cli -h "$h" -p "$PORT" "$@"; }

# The IPv4 addresses of the live members (not this pod), from cluster DNS.
member_ips() {
  nslookup -type=a "$MEMBERS" 2>/dev/null |
    awk '/^Name:/ {n = 1} n && /^Address/ {sub(/^Address:[ \t]*/, ""); print}' |
    grep -vx "${POD_IP:?}" || true
}

# Starts redis-server on the claim, in cluster mode, in the background ($REDIS_PID), and waits
# until it answers. Its identity (node ID, slots, the other nodes) is /data/nodes.conf; every
# acknowledged write is on disk first (appendfsync always). A member that is down does not stop
# the others from serving their slots (cluster-require-full-coverage no). No replica ever fails
# over (cluster-replica-no-failover): this example makes none, and a node Redis made a replica
# (below) holds a copy that may lag its master's acknowledged writes; taking over its master's
# slots while the master is down would lose those writes when the master comes back.
start_redis() {
  redis-server --port "$PORT" --dir "$DATA" --cluster-enabled yes \
    --cluster-config-file nodes.conf --cluster-node-timeout 5000 \
    --cluster-require-full-coverage no --cluster-replica-no-failover yes \
    --appendonly yes --appendfsync always --save "" \
    --protected-mode no &
  REDIS_PID=$!
  until cli ping >/dev/null 2>&1; do
    kill -0 "$REDIS_PID" 2>/dev/null || { log "redis-server exited"; return 1; }
    sleep 0.2
  done
}

# Stops the local redis-server and waits for it. Redis refuses to stop while it writes its first
# append-only file (right after a full sync as a replica: "Writing initial AOF, can't exit"), so
# it is asked again, every half second, until it no longer answers; after a minute it is killed.
stop_redis() {
  tries=0
  while cli ping >/dev/null 2>&1 && [ "$tries" -lt 120 ]; do
    cli shutdown nosave >/dev/null 2>&1 || kill -TERM "$REDIS_PID" 2>/dev/null
    tries=$((tries + 1))
    sleep 0.5
  done
  if cli ping >/dev/null 2>&1; then
    log "redis-server does not stop: killing it"
    kill -KILL "$REDIS_PID" 2>/dev/null
  fi
  wait "$REDIS_PID" 2>/dev/null || true
}

# Tells every live member where this node is now: a pod comes back with a new IP, and a node
# that is met at a new address by the ID it already knows updates that node's address.
announce() {
  for ip in $(member_ips); do cli cluster meet "$ip" "$PORT" >/dev/null 2>&1 || true; done
}

# Whether this node is a replica. Nothing in this example makes replicas; Redis makes one of a
# master that lost its last slot to another: the usual end of a drain (its own SETSLOT of its
# last slot, or the target's word for it reaching it first), and what a drain killed after its
# last handover, or a cancelled one, comes back as. It serves no slot, and its keys are a copy
# of its master's.
is_replica() {
  cli cluster nodes | awk '$3 ~ /myself/ && $3 ~ /slave/ {r = 1} END {exit !r}'
}

# How many slots the node at HOST (default: this one) serves; nothing (and status 1) when the
# node does not answer: an empty answer is not "no slot".
slots_of() {
  local view
  if [ -n "${1:-}" ]; then view=$(rcli "$1" cluster nodes); else view=$(cli cluster nodes); fi &&
    [ -n "$view" ] || return 1
  echo "$view" |
    awk -v id="${2:-myself}" '
      (id == "myself" && $3 ~ /myself/) || $1 == id {
        for (i = 9; i <= NF; i++) {
          if ($i ~ /^\[/) continue            # [slot->-id] / [slot-<-id]: a migration in flight
          n = split($i, r, "-"); c += (n == 2 ? r[2] - r[1] + 1 : 1)
        }
      }
      END {print c + 0}'
}

# Waits until `redis-cli --cluster check` through HOST passes: every slot served, no slot half
# migrated, every node agreeing. A migration an interrupted drain or join left open is finished
# by `--cluster fix`. Gives up (returns 1) after about a minute.
settle() {
  tries=0
  until redis-cli --cluster check "$1:$PORT" >/dev/null 2>&1; do
    tries=$((tries + 1))
    [ "$tries" -le 30 ] || { log "the cluster did not settle"; return 1; }
    if redis-cli --cluster check "$1:$PORT" 2>&1 | grep -q "open slot"; then
      log "fixing open slots"
      redis-cli --cluster fix "$1:$PORT" --cluster-yes >/dev/null 2>&1 || true
    fi
    sleep 2
  done
}
