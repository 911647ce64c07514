# Shared by member.sh (the StatefulSet's pods) and drain.sh (the drain pods): sourced, busybox sh.

SET=${SET_NAME:?}
DOMAIN=${SERVICE_NAME:?}.${POD_NAMESPACE:?}.svc.cluster.local
NAME=${MEMBER_NAME:-$(hostname)}
# Members are known to each other by their stable DNS names, never by IP: a pod that comes back
# has a new IP and the same name.
PEER_URL=http://$NAME.$DOMAIN:2380
CLIENT_URL=http://$NAME.$DOMAIN:2379

log() { echo "$(date -u +%H:%M:%S) $*" >&2; }

# The client URLs of the other live members (from cluster DNS: the headless Service publishes
# every member, Ready or not, and never a drain pod).
other_endpoints() {
  nslookup -type=a "$DOMAIN" 2>/dev/null |
    awk '/^Name:/ {n = 1} n && /^Address/ {sub(/^Address:[ \t]*/, ""); print}' |
    grep -vx "${POD_IP:?}" | sed 's|.*|http://&:2379|' || true
}

# The first other member that answers as a healthy member of a cluster with a quorum.
live_endpoint() {
  for ep in $(other_endpoints); do
    if etcdctl --endpoints="$ep" --command-timeout=3s endpoint health >/dev/null 2>&1; then
      echo "$ep"
      return 0
    fi
  done
  return 1
}

# The membership, linearizably read through ENDPOINT: one line per member,
# "ID, status, name, peer URLs, client URLs, is learner".
members() {
  etcdctl --endpoints="$1" --command-timeout=5s member list --consistency=l
}
