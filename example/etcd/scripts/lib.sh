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
# every member, Ready or not, and never a drain pod). Fails when the lookup itself fails: that
# is not "no other member".
other_endpoints() {
  local answer
  answer=$(nslookup -type=a "$DOMAIN" 2>/dev/null) || return 1
  echo "$answer" |
    awk '/^Name:/ {n = 1} n && /^Address/ {sub(/^Address:[ \t]*/, ""); print}' |
    grep -vx "${POD_IP:?}" | sed 's|.*|http://&:2379|' || true
}

# The first other member that answers as a healthy member of a cluster with a quorum. Status 1:
# none answers; 2: the members cannot be looked up.
live_endpoint() {
  local eps
  eps=$(other_endpoints) || return 2
  for ep in $eps; do
    if etcdctl --endpoints="$ep" --command-timeout=3s endpoint health >/dev/null 2>&1; then
      echo "$ep"
      return 0
    fi
  done
  return 1
}

# Whether a membership (members' output) is this set's: it lists members by this set's names. A
# member read from another cluster (an address reused by another etcd) proves nothing.
ours() {
  echo "$1" | grep -qF ".$DOMAIN:2380,"
}

# Whether a membership lists this member.
lists_me() {
  echo "$1" | grep -qF ", $PEER_URL,"
}

# The membership, linearizably read through ENDPOINT: one line per member,
# "ID, status, name, peer URLs, client URLs, is learner".
members() {
  etcdctl --endpoints="$1" --command-timeout=5s member list --consistency=l
}
