#!/bin/sh
# The drain of a Redis Cluster member, run in its drain pod by `drainer exec -- sh drain.sh`.
#
# The drain pod has the removed member's name, hostname and claim, so this starts the same node
# (same node ID, same slots and keys, from /data) at the pod's new address, hands every slot it
# serves to the members that stay, removes the node from the cluster, stops it, and exits 0.
# `drainer exec` then writes the completion record, the controller's proof that the drain
# finished, and the claim is deleted.
#
# The members that stay are `drainer exec`'s DRAIN_PEERS: the Ready pods of the set's current
# range, read live from the StatefulSet. Other members may be leaving at the same time (6 -> 3
# drains three) or be down; slots go only to members that stay, and nothing here waits for the
# whole cluster to be healthy.
#
# A slot moves as Redis Cluster moves slots (what `redis-cli --cluster reshard` does, without its
# whole-cluster check, which refuses while any other member is down): the target is told it is
# IMPORTING the slot, this node that it is MIGRATING it; keys go by MIGRATE (a key is deleted
# here only once the target has it; new keys of the slot already go to the target, by ASK); then
# the slot is assigned to the target, on the target first. Redis keeps MIGRATING states in
# nodes.conf, so an attempt that dies midway leaves them there, and the next attempt finishes
# those slots with the same target before it moves any other.
#
# Exit codes: 0 done; 75 asks `drainer exec` to run this again after a backoff (no member to
# take the slots, a step refused); anything else fails the attempt. Every step can be repeated.
set -u
# No globbing: key names pass through the shell (a key named * is a key, not a file list).
set -f
. /scripts/lib.sh

trap 'log "told to stop"; stop_redis; exit 143' TERM INT
retry() { log "$*; trying again later"; stop_redis; exit 75; }

# 1. The node, as it was when its pod went away.
start_redis || exit 75
me=$(cli cluster myid)
peers=$(echo "${DRAIN_PEERS:-}" | tr ',' '\n' | sed -n 's|^http://\([^:/]*\):.*|\1|p')
[ -n "$peers" ] || retry "no member that stays is Ready"
log "draining node $me (now at $POD_IP) to the members at $(echo $peers)"

# Tells every node to forget this one: the members that stay, and every other node this one
# knows. Redis wants a FORGET from every node within 60 s: a node that still knows this one tells
# the others about it again after that, and they list it again (as failed, with no slot).
# That happens with OrderedReady: a member leaving after this one is down while this drain runs;
# when its own drain starts its node, the node tells the cluster about the nodes it knew,
# including those drained meanwhile. So the ghosts it brought back (failed, no slot, as any
# member that stays sees them) are forgotten here too: a node the cluster agreed has failed, and
# that serves no slot, holds nothing; a member that does come back meets the cluster as it
# starts (member.sh).
forget_everywhere() {
  known=$(cli cluster nodes 2>/dev/null | awk '$3 !~ /myself/ {sub(/:.*/, "", $2); print $2}')
  ghosts=$(for ip in $peers; do rcli "$ip" cluster nodes 2>/dev/null; done |
    awk 'NF == 8 && $3 ~ /(^|,)fail(,|$)/ && $3 !~ /myself/ {print $1}' | sort -u)
  for ip in $peers $known; do
    for id in $me $ghosts; do rcli "$ip" cluster forget "$id" >/dev/null 2>&1 || true; done
  done
}

# 2. Already removed by an earlier attempt: it knows only itself and holds nothing.
nodes=$(cli cluster nodes) && echo "$nodes" | grep -q myself || retry "cannot read the node's view"
if [ "$(echo "$nodes" | wc -l)" = 1 ] && [ "$(slots_of)" = 0 ] && [ "$(cli dbsize)" = 0 ]; then
  log "already removed from the cluster"
  forget_everywhere
  stop_redis
  exit 0
fi

# 3. Back in the cluster at the new address: meet the members that stay, and wait until each
#    of them knows this node as connected (they learn the new address from the meeting).
for ip in $peers; do cli cluster meet "$ip" "$PORT" >/dev/null 2>&1 || true; done
for ip in $peers; do
  n=0
  until rcli "$ip" cluster nodes 2>/dev/null | grep -q "^$me .* connected"; do
    n=$((n + 1)); [ "$n" -le 60 ] || retry "member $ip does not see this node"
    # Met again every 5 s: a member may have forgotten this node as it came back (member.sh).
    [ $((n % 10)) != 0 ] || cli cluster meet "$ip" "$PORT" >/dev/null 2>&1 || true
    sleep 0.5
  done
done

# Redis serves (and MIGRATE runs) only once the node sees the cluster as ok: a node that just
# started waits a moment before it takes part (and never does while it sees only a minority).
# A node that serves no slot any more (an earlier attempt handed over the last one and died
# before it left) has nothing to move and need not wait: with another member down and not
# drained yet (OrderedReady drains one at a time), the remaining masters may be a minority, and
# the cluster is not ok again until this drain lets the next one start.
n=0
until [ "$(slots_of)" = 0 ] || cli cluster info | grep -q '^cluster_state:ok'; do
  n=$((n + 1)); [ "$n" -le 60 ] || retry "this node does not see the cluster as ok"
  sleep 0.5
done

# The slots this node serves, one per line; fails when the node does not answer (an empty
# answer is not "no slot").
my_slots() {
  local view
  view=$(cli cluster nodes) && [ -n "$view" ] || return 1
  echo "$view" | awk '$3 ~ /myself/ {for (i = 9; i <= NF; i++) {if ($i ~ /^\[/) continue;
    n = split($i, r, "-"); if (n == 1) print r[1]; else for (s = r[1]; s <= r[2]; s++) print s}}'
}

# send HOST: runs the commands on stdin against HOST ("" for this node) in one pipeline; fails
# (printing the errors) unless the node answered OK to every command: no answer at all (the node
# is gone) is a failure too.
send() {
  local cmds want out got
  cmds=$(cat)
  want=$(echo "$cmds" | grep -c .)
  if [ -n "$1" ]; then out=$(echo "$cmds" | rcli "$1" 2>&1); else out=$(echo "$cmds" | cli 2>&1); fi
  got=$(echo "$out" | grep -c '^OK$' || true)
  [ "$got" = "$want" ] || {
    log "${1:-this node} answered OK to $got of $want: $(echo "$out" | grep -v '^OK$' | sort | uniq -c | head -n 3 | tr '\n' ' ')"
    return 1
  }
}

# counts SLOT...: "SLOT KEYS" for each slot, as this node answers; fails unless it answers a
# number for every slot (a node that is gone holds no keys only as far as an empty answer goes).
counts() {
  local out s
  out=$(for s in "$@"; do echo "CLUSTER COUNTKEYSINSLOT $s"; done | cli) || return 1
  echo "$out" | awk -v list="$*" 'BEGIN {n = split(list, sl, " ")}
    $0 !~ /^[0-9]+$/ {bad = 1} {print sl[NR], $0} END {exit bad || NR != n}'
}

# move TARGET_ID TARGET_IP SLOT...: moves the slots to the target. A slot is handed over only
# once this node answers that it holds no key of it: every key went by MIGRATE, which deletes a
# key here only once the target has it.
move() {
  # Local: the callers loop over their own n, s, t.
  local tid=$1 tip=$2 c s n left keys r
  shift 2
  for s in "$@"; do echo "CLUSTER SETSLOT $s IMPORTING $me"; done | send "$tip" || return 1
  for s in "$@"; do echo "CLUSTER SETSLOT $s MIGRATING $tid"; done | send "" || return 1
  c=$(counts "$@") || { log "cannot count the keys of the slots"; return 1; }
  for s in $(echo "$c" | awk '$2 > 0 {print $1}'); do
    n=$(counts "$s" | awk '{print $2}')
    while [ -n "$n" ] && [ "$n" -gt 0 ]; do
      keys=$(cli cluster getkeysinslot "$s" 100) || { log "cannot list the keys of slot $s"; return 1; }
      # REPLACE: a copy on the target can only be from an interrupted MIGRATE of this node's own.
      r=$(cli migrate "$tip" "$PORT" "" 0 10000 REPLACE KEYS $(echo "$keys" | tr '\n' ' ')) &&
        { [ "$r" = OK ] || [ "$r" = NOKEY ]; } || { log "migrate of slot $s: $r"; return 1; }
      left=$(counts "$s" | awk '{print $2}')
      # No progress (a key whose name the shell cannot pass: empty, with whitespace): retry
      # later, and the claim stays.
      [ -n "$left" ] && [ "$left" -lt "$n" ] ||
        { log "slot $s: ${left:-no answer} keys left after moving $n"; return 1; }
      n=$left
    done
  done
  c=$(counts "$@") && [ -z "$(echo "$c" | awk '$2 != 0')" ] ||
    { log "keys are left in the slots to hand over"; return 1; }
  # The target's claim must win over this node's wherever both are heard: its config epoch
  # above this node's. (Equal epochs are a collision Redis settles by raising one of them; if it
  # raised this node's while the slots were still claimed here, this stale claim would win and
  # the target would drop the keys it took.) The target raises its epoch if it is not the
  # highest; if it is and equals this node's, try again once Redis has settled it.
  epoch_above_mine "$tip" || return 1
  # Owned by the target: the target first (it tells everyone), then here. This node may refuse
  # its own SETSLOT because it already took the target's word for it: a master whose last slot
  # the target claimed becomes the target's replica at once ("use SETSLOT only with masters").
  # What counts is that its own view gives every one of these slots to the target.
  for s in "$@"; do echo "CLUSTER SETSLOT $s NODE $tid"; done | send "$tip" || return 1
  for s in "$@"; do echo "CLUSTER SETSLOT $s NODE $tid"; done | send "" || {
    held_by "$tid" "$@" || return 1
    log "this node had already given the slots to the target"
  }
}

# epoch_above_mine HOST: whether the node at HOST has a config epoch above this node's, after
# asking it to raise its own (CLUSTER BUMPEPOCH) if not.
epoch_above_mine() {
  local theirs ours
  ours=$(cli cluster nodes | awk '$3 ~ /myself/ {print $7}')
  theirs=$(rcli "$1" cluster nodes | awk '$3 ~ /myself/ {print $7}')
  case "$ours" in "" | *[!0-9]*) log "cannot read this node's epoch"; return 1 ;; esac
  case "$theirs" in "" | *[!0-9]*) log "cannot read the epoch of $1"; return 1 ;; esac
  [ "$theirs" -gt "$ours" ] && return 0
  rcli "$1" cluster bumpepoch >/dev/null 2>&1 || true
  theirs=$(rcli "$1" cluster nodes | awk '$3 ~ /myself/ {print $7}')
  case "$theirs" in "" | *[!0-9]*) log "cannot read the epoch of $1"; return 1 ;; esac
  [ "$theirs" -gt "$ours" ] ||
    { log "the epoch of $1 ($theirs) is not above this node's ($ours) yet"; return 1; }
}

# held_by ID SLOT...: whether this node's view gives every one of the slots to node ID (fails
# when the node does not answer).
held_by() {
  local view id
  view=$(cli cluster nodes) && [ -n "$view" ] || return 1
  id=$1
  shift
  echo "$view" | awk -v id="$id" -v list="$*" '
    BEGIN {n = split(list, want, " ")}
    $1 == id {for (i = 9; i <= NF; i++) {if ($i ~ /^\[/) continue
      k = split($i, r, "-"); if (k == 1) has[r[1]] = 1; else for (s = r[1]; s <= r[2]; s++) has[s] = 1}}
    END {for (j = 1; j <= n; j++) if (!(want[j] in has)) exit 1; exit 0}'
}

# The members that stay, as "ID:IP", each ID as the member itself answers it (not as this node,
# which was down, remembers whoever had that address).
targets=""
for ip in $peers; do
  tid=$(rcli "$ip" cluster myid 2>/dev/null) || continue
  case $tid in *[!0-9a-f]* | "") continue ;; esac
  [ "$tid" != "$me" ] && targets="$targets $tid:$ip"
done
[ -n "$targets" ] || retry "no member that stays answers"

# MIGRATE needs the targets to see the cluster as ok too: a member that saw this node fail
# (it was down) takes a moment after it is back, and refuses keys meanwhile (CLUSTERDOWN).
# A node with no slot left has nothing to migrate and does not wait (see above: the cluster may
# not be ok again until this drain ends).
[ "$(slots_of)" = 0 ] || for t in $targets; do
  w=0
  until rcli "${t#*:}" cluster info 2>/dev/null | grep -q '^cluster_state:ok'; do
    w=$((w + 1)); [ "$w" -le 60 ] || retry "member ${t#*:} does not see the cluster as ok"
    sleep 0.5
  done
done

# 4. Slots an earlier attempt left MIGRATING go on to the same target first: some of their keys
#    are there already. A target that is not among the members that stay and answer now is
#    waited for (it holds those keys in a slot it does not own yet).
nodes=$(cli cluster nodes) || retry "cannot read the node's view"
for pair in $(echo "$nodes" | awk '$3 ~ /myself/ {for (i = 9; i <= NF; i++) if ($i ~ /->-/) {gsub(/[][]/, "", $i); sub(/->-/, ":", $i); print $i}}'); do
  s=${pair%%:*} tid=${pair#*:}
  tip=""
  for t in $targets; do [ "${t%%:*}" = "$tid" ] && tip=${t#*:}; done
  [ -n "$tip" ] || retry "slot $s was left migrating to $tid, which is not a member that stays and answers"
  log "finishing slot $s, left migrating to $tid"
  move "$tid" "$tip" "$s" || retry "finishing slot $s failed"
done

# 5. Every other slot, an equal share to each member that stays, in batches.
count=$(echo $targets | wc -w)
slots=$(my_slots) || retry "cannot read the slots of this node"
total=$(echo "$slots" | grep -c . || true)
log "moving $total slots to $count members"
share=$(( (total + count - 1) / count ))
i=0
for t in $targets; do
  mine=$(echo "$slots" | awk -v from=$((i * share + 1)) -v to=$(((i + 1) * share)) 'NR >= from && NR <= to')
  i=$((i + 1))
  [ -n "$mine" ] || continue
  # Batches of 500 slots: bounded pipelines, and progress in the log.
  n=$(echo "$mine" | wc -l)
  b=0
  while [ "$b" -lt "$n" ]; do
    batch=$(echo "$mine" | awk -v from=$((b + 1)) -v to=$((b + 500)) 'NR >= from && NR <= to')
    b=$((b + 500))
    log "moving $(echo "$batch" | wc -l) slots to ${t%%:*} at ${t#*:}"
    move "${t%%:*}" "${t#*:}" $batch || retry "moving slots to ${t#*:} failed"
  done
done

# 6. Nothing may be left here: no slot, so no key of its own. A master that loses its last
#    slot may be turned by Redis into a replica of the member that took it (a drain killed after
#    its last handover comes back that way): its keys are then that member's, copied to it, and
#    CLUSTER RESET below drops them.
[ "$(slots_of)" = 0 ] || retry "slots are still here"
if is_replica; then
  log "this node serves no slot and is a replica of a member that stays"
else
  keys=$(cli dbsize)
  [ "$keys" = 0 ] || retry "$keys keys are still here"
fi

# 7. Leave the cluster: every member that stays forgets the node, and the node is reset (it
#    then knows no other node: what step 2 recognises). Then stop.
forget_everywhere
cli cluster reset soft >/dev/null || retry "cluster reset failed"
stop_redis
log "drained: every slot handed over, the node removed from the cluster"
exit 0
