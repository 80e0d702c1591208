#!/usr/bin/env bash
# Several hosts (real processes): the coordinator and the agents run on separate "hosts",
# Linux network namespaces joined by veth pairs to a bridge in a hub namespace, each with its
# own private address (10.77.0.0/24) and its own hostname (a UTS namespace per process); no
# process may listen on 127.0.0.1 or a wildcard address (every listener is checked), so none
# can work by reaching 127.0.0.1. (Each host's loopback is up, as on a real host: with it down,
# two agents of one host could not reach each other at the host's own address, and a restore
# waited two minutes on such a connect.)
# Storage is the shared filesystem (the namespaces share the mount namespace).
#
#   coord 10.77.0.1   tessera-coordinator, listening on 10.77.0.1 only; the CLI
#   a     10.77.0.11  save: ranks 0, 2 (dp=0)   load: rank 1
#   b     10.77.0.12  save: ranks 1, 3 (dp=1)   load: rank 2
#   c     10.77.0.13  load: ranks 0, 3 (a host that did not save)
#
# Saves tp=2,dp=2 with the distributed optimizer (its DP gather crosses hosts a and b), commits,
# `tessera verify` in the coordinator's namespace, reloads on tp=1,dp=4 over hosts c, a, b and
# checks every byte; then saves again on a and b, loses host b (its agents SIGKILLed) and
# restores its ranks on host c from the memory copies their buddies on a hold (DESIGN.md
# "Memory tier"), none from disk; then once more on pp=2, where the restored rank's trainer
# reads its buddy's copy on host a itself. Asserts: every TCP listener of every namespace is bound to that host's
# private address (none on 127.0.0.1, 0.0.0.0 or [::]); every agent's advertised peer address
# is its host's address and is listening there; agents on different hosts report different
# node ids (their hostnames); the gather's bytes crossed the links between hosts a and b.
#
# Needs root and `ip netns`. Where the machine does not allow network namespaces the test
# SKIPS visibly: it prints "SKIP: <why>" and writes a JUnit report with a <skipped> case to
# $XML_OUTPUT_FILE (tests/summarize.py counts it as skipped). Namespaces are named
# tsrh-<pid>-<random>-*, so parallel runs never collide; a trap deletes them.
set -uo pipefail
source deploy/lib/procs.sh
source deploy/lib/cluster.sh
source tests/skip.sh
BIN=.
DIR=${TEST_TMPDIR:-$(mktemp -d)}/run
mkdir -p "$DIR/logs"
JOB=hosts-$$  # staging regions in the shared /dev/shm are named by job and rank
SAVE_LAYOUT=tp=2,dp=2
LOAD_LAYOUT=tp=1,dp=4
MODEL=(--layers=2 --dim=128)
LEASE_MS=1500
HOSTS=(coord a b c)
declare -A ADDR=([coord]=10.77.0.1 [a]=10.77.0.11 [b]=10.77.0.12 [c]=10.77.0.13)
source tests/hosts/lib.sh

# ---- the hosts; the coordinator on its own ---------------------------------------------------
make_hosts
# Ranks go round-robin over RANK_HOSTS (save: rank % 2 is the dp index, so each DP group
# spans hosts a and b).
RANK_HOSTS=(a b)
start_coordinator_on_coord --keep_last=2
for h in coord a; do
  if reaches "$h" 127.0.0.1 "$COORD_PORT"; then
    fail "127.0.0.1:$COORD_PORT answers on host $h: not listening on ${ADDR[coord]} only"
  fi
done

# agents_json FILE: `tessera agents` of the job as JSON.
agents_json() { tessera agents "$JOB" --json >"$1" 2>&1 || fail "tessera agents: $(cat "$1")"; }

# check_listeners: every TCP listener of every host is on that host's private address.
check_listeners() {
  local h out bad
  for h in "${HOSTS[@]}"; do
    out=$(ip netns exec "$TAG-$h" ss -Hltn) || fail "ss on $h"
    echo "$out" >"$DIR/logs/listeners-$1-$h.txt"
    # gRPC binds a dual-stack socket where IPv6 works: 10.77.0.1 shows as [::ffff:10.77.0.1].
    bad=$(echo "$out" | awk -v a="${ADDR[$h]}" \
      'NF >= 4 && index($4, a ":") != 1 && index($4, "[::ffff:" a "]:") != 1 {print $4}')
    [ -z "$bad" ] || fail "host $h has TCP listeners off its address ${ADDR[$h]}: $bad"
  done
}

# check_agents FILE: each rank's node id is its host's hostname and its peer address is its
# host's address, listening there; different hosts, different node ids.
check_agents() {
  local json=$1 r h
  local expect=()
  for r in $(seq 0 $(($(world_size "$2") - 1))); do
    h=$(host_of_rank "$r")
    expect+=("$r=$TAG-$h=${ADDR[$h]}=$DIR/logs/listeners-$3-$h.txt")
  done
  /usr/bin/python3 - "$json" "${expect[@]}" <<'PY' || fail "agents on the wrong hosts (see $json)"
import json, sys
agents = {a["coord"]["rank"]: a for a in json.load(open(sys.argv[1]))["agents"]}
expected = [e.split("=", 3) for e in sys.argv[2:]]
assert len(agents) == len(expected), "%d agents registered, %d expected" % (len(agents), len(expected))
node_of_host = {}
for rank, node, addr, listeners in expected:
    a = agents[int(rank)]
    assert a["alive"], "rank %s not alive" % rank
    assert a["node_id"] == node, "rank %s reports node %r, not %r" % (rank, a["node_id"], node)
    host, _, port = a["peer_address"].rpartition(":")
    assert host == addr, "rank %s advertises %s, not its host's %s" % (rank, a["peer_address"], addr)
    listening = [l.split()[3].replace("[::ffff:", "").replace("]", "") for l in open(listeners) if l.strip()]
    assert a["peer_address"] in listening, "%s is not listening on its host: %s" % (a["peer_address"], listening)
    node_of_host.setdefault(addr, set()).add(a["node_id"])
nodes = [n for ns in node_of_host.values() for n in ns]
assert len(node_of_host) >= 2 and len(set(nodes)) == len(node_of_host), "node ids per host: %s" % node_of_host
print("agents:", ", ".join("rank %d on %s (%s)" % (r, a["node_id"], a["peer_address"]) for r, a in sorted(agents.items())))
PY
}

# ---- save on hosts a and b -----------------------------------------------------------------
start_agents "$JOB" "$SAVE_LAYOUT" || fail "agents ($SAVE_LAYOUT)"
check_listeners save
agents_json "$DIR/logs/agents-save.json"
check_agents "$DIR/logs/agents-save.json" "$SAVE_LAYOUT" save
a_tx_before=$(tx_bytes a)
b_tx_before=$(tx_bytes b)
run_trainers "$JOB" "$SAVE_LAYOUT" --mode=save --steps=10,20 --optimizer=distributed "${MODEL[@]}" ||
  fail "saving on $SAVE_LAYOUT across hosts a and b"
b_tx=$(($(tx_bytes b) - b_tx_before))
a_tx=$(($(tx_bytes a) - a_tx_before))
grep -q "step 20 committed" "$DIR/logs/trainer-$JOB-0.out" || fail "no commit of step 20"
dir20="$DIR/ckpt/$JOB/step-000000020"
[ -f "$dir20/manifest.pb" ] || fail "no committed directory for step 20"
# Each DP group is one rank on a and one on b, and leaders are spread over the DP ranks, so
# optimizer slices cross in both directions; the rest (plans, heartbeats) is a few KiB.
echo "during the saves host a sent $a_tx bytes over its link, host b $b_tx"
[ "$a_tx" -gt $((1 << 20)) ] && [ "$b_tx" -gt $((1 << 20)) ] ||
  fail "hosts a and b sent $a_tx and $b_tx bytes: the DP gather did not cross hosts"
check_listeners save-after
stop_agents || fail "agents did not stop cleanly"

# ---- verify and list from other hosts ------------------------------------------------------
tessera verify "$dir20" >"$DIR/logs/verify.out" 2>&1 || fail "verify: $(cat "$DIR/logs/verify.out")"
grep -q "^OK: " "$DIR/logs/verify.out" || fail "verify printed no OK: $(cat "$DIR/logs/verify.out")"
on c "$BIN/client/cli/tessera" --coordinator="$(coordinator_address)" checkpoints "$JOB" \
  >"$DIR/logs/checkpoints.out" 2>&1 || fail "tessera checkpoints from host c: $(cat "$DIR/logs/checkpoints.out")"
grep -q "20" "$DIR/logs/checkpoints.out" || fail "step 20 not listed: $(cat "$DIR/logs/checkpoints.out")"
echo "verify (on $TAG-coord): $(cat "$DIR/logs/verify.out")"

# ---- reload on another layout, over hosts c, a, b ------------------------------------------
RANK_HOSTS=(c a b)
start_agents "$JOB" "$LOAD_LAYOUT" || fail "agents ($LOAD_LAYOUT)"
check_listeners load
agents_json "$DIR/logs/agents-load.json"
check_agents "$DIR/logs/agents-load.json" "$LOAD_LAYOUT" load
run_trainers "$JOB" "$LOAD_LAYOUT" --mode=load --load_step=-1 --optimizer=distributed "${MODEL[@]}" ||
  fail "loading on $LOAD_LAYOUT"
for r in $(seq 0 $(($(world_size "$LOAD_LAYOUT") - 1))); do
  grep -q "loaded step 20 on $LOAD_LAYOUT" "$DIR/logs/trainer-$JOB-$r.out" ||
    fail "rank $r did not load step 20 byte for byte: $(cat "$DIR/logs/trainer-$JOB-$r.out")"
done
stop_agents || fail "agents ($LOAD_LAYOUT) did not stop cleanly"

# ---- a node lost: its replacement restores from memory, its buddies' -----------------------
# Step 30 saved on hosts a and b again: each agent's memory buddy is on the other host (the
# coordinator's ring over the two nodes), so a's agents hold copies of the data files b's
# agents wrote. Host b is lost: its agents SIGKILLed. Ranks 1 and 3 start again on host c, a
# node that never held anything; their trainers load step 30 byte for byte with every byte
# from memory — their own files from the buddy copies on a, the rest from a's agents' own
# copies — and none from disk.
RANK_HOSTS=(a b)
start_agents "$JOB" "$SAVE_LAYOUT" || fail "agents ($SAVE_LAYOUT, for step 30)"
run_trainers "$JOB" "$SAVE_LAYOUT" --mode=save --steps=30 --optimizer=distributed "${MODEL[@]}" ||
  fail "saving step 30 on $SAVE_LAYOUT across hosts a and b"
dir30="$DIR/ckpt/$JOB/step-000000030"
[ -f "$dir30/manifest.pb" ] || fail "no committed directory for step 30"
# buddies_hold: every data file of step 30 that a rank on b wrote is held as a buddy copy by
# an agent on a.
buddies_hold() {
  tessera agents "$JOB" --json >"$DIR/logs/agents-buddies.json" 2>/dev/null || return 1
  /usr/bin/python3 - "$DIR/logs/agents-buddies.json" "$dir30" "$TAG-a" <<'PY'
import json, os, re, sys
agents = json.load(open(sys.argv[1]))["agents"]
written_on_b = {int(m.group(1)) for f in os.listdir(sys.argv[2])
                for m in [re.match(r"data-(\d+)\.safetensors$", f)] if m and int(m.group(1)) % 2 == 1}
held_on_a = {c.get("writer_rank", 0) for a in agents if a["node_id"] == sys.argv[3]
             for c in a.get("buddy_copies", []) if c["step"] == "30"}
sys.exit(0 if written_on_b and written_on_b <= held_on_a else 1)
PY
}
wait_until 30 buddies_hold ||
  fail "host a's agents do not hold buddy copies of b's step 30 files: $(cat "$DIR/logs/agents-buddies.json")"
# Those copies are read over their holders' bulk ports (agent/memory_bulk.h), on host a's address.
/usr/bin/python3 - "$DIR/logs/agents-buddies.json" "$TAG-a" "${ADDR[a]}" <<'PY' ||
import json, sys
agents = json.load(open(sys.argv[1]))["agents"]
bulk = [c.get("bulk_address", "") for a in agents if a["node_id"] == sys.argv[2]
        for c in a.get("buddy_copies", [])]
bad = [b for b in bulk if b.rpartition(":")[0] != sys.argv[3]]
sys.exit("buddy copies on host a name bulk ports %s, not on %s" % (bad, sys.argv[3]) if bad else 0)
PY
  fail "bulk ports of host a's agents (see $DIR/logs/agents-buddies.json)"
# ... and they arrived over them.
for r in 0 2; do
  grep -q "kept the memory copy of .* of step 30 from rank .* over the bulk port" \
    "$DIR/logs/agent-$JOB-$r.log" || fail "rank $r on host a did not receive step 30's buddy copy over its bulk port"
done
for r in 1 3; do
  kill -KILL "${AGENT_PIDS[$r]}" 2>/dev/null
  wait "${AGENT_PIDS[$r]}" 2>/dev/null
done
echo "host b lost: agents of ranks 1 and 3 SIGKILLed; starting them on host c"
RANK_HOSTS=(a c)
for r in 1 3; do
  mark_agent_log "$JOB" "$r"
  start_agent "$JOB" "$SAVE_LAYOUT" "$r"
  wait_registered "$JOB" "$r" || fail "rank $r's replacement on host c did not register"
done
run_trainers "$JOB" "$SAVE_LAYOUT" --mode=load --load_step=-1 --optimizer=distributed "${MODEL[@]}" ||
  fail "loading step 30 with ranks 1 and 3 on host c"
for r in 0 1 2 3; do
  grep -q "loaded step 30 on $SAVE_LAYOUT" "$DIR/logs/trainer-$JOB-$r.out" ||
    fail "rank $r did not load step 30 byte for byte: $(cat "$DIR/logs/trainer-$JOB-$r.out")"
done
for r in 1 3; do
  sources=$(grep "load sources:" "$DIR/logs/trainer-$JOB-$r.out")
  echo "rank $r on host c: $sources"
  echo "$sources" | grep -q " disk_bytes=0 " || fail "rank $r read from disk: $sources"
  echo "$sources" | grep -Eq "fetched_from_peers=[1-9]" || fail "rank $r fetched nothing from host a: $sources"
done
stop_agents || fail "agents (step 30) did not stop cleanly"

# ---- a node lost, pp=2: its trainer reads the buddy's copy itself ---------------------------
# Step 40 saved with pp=2 on hosts a (rank 0) and b (rank 1): every tensor of a stage is its
# own and written by it, so a stage restoring in that layout reads one data file. Host b is
# lost; rank 1 starts again on host c, and its trainer reads that file from its buddy on host
# a over a's bulk port itself (DESIGN.md "Memory tier": fetched by the trainer), across the
# hosts' link: byte for byte, none from disk, none through its agent.
PP_LAYOUT=pp=2
RANK_HOSTS=(a b)
start_agents "$JOB" "$PP_LAYOUT" || fail "agents ($PP_LAYOUT, for step 40)"
run_trainers "$JOB" "$PP_LAYOUT" --mode=save --steps=40 "${MODEL[@]}" ||
  fail "saving step 40 on $PP_LAYOUT across hosts a and b"
wait_for_line "$DIR/logs/agent-$JOB-1.log" "memory copy of step 40 .*sent to buddy" 30 ||
  fail "rank 1's copy of step 40 did not reach its buddy on host a"
kill -KILL "${AGENT_PIDS[1]}" 2>/dev/null
wait "${AGENT_PIDS[1]}" 2>/dev/null
echo "host b lost again: rank 1's agent SIGKILLed; starting it on host c"
RANK_HOSTS=(a c)
mark_agent_log "$JOB" 1
start_agent "$JOB" "$PP_LAYOUT" 1
wait_registered "$JOB" 1 || fail "rank 1's replacement on host c did not register (step 40)"
run_trainers "$JOB" "$PP_LAYOUT" --mode=load --load_step=-1 "${MODEL[@]}" ||
  fail "loading step 40 with rank 1 on host c"
for r in 0 1; do
  grep -q "loaded step 40 on $PP_LAYOUT" "$DIR/logs/trainer-$JOB-$r.out" ||
    fail "rank $r did not load step 40 byte for byte: $(cat "$DIR/logs/trainer-$JOB-$r.out")"
done
sources=$(grep "load sources:" "$DIR/logs/trainer-$JOB-1.out" | tail -n 1)
echo "rank 1 on host c: $sources"
echo "$sources" | grep -q " disk_bytes=0 " || fail "rank 1 read from disk: $sources"
echo "$sources" | grep -Eq "fetched_by_client=[1-9]" ||
  fail "rank 1's trainer did not read its buddy's copy itself: $sources"
grep -q "client_fetches_from=${ADDR[a]}:" "$DIR/logs/agent-$JOB-1.log" ||
  fail "rank 1's agent did not name the copy on host a for its trainer"
stop_agents || fail "agents (step 40) did not stop cleanly"
stop_coordinator || fail "coordinator did not stop cleanly"
echo "PASS: coordinator and agents on separate hosts ($TAG-*); saved $SAVE_LAYOUT on a+b" \
  "(distributed optimizer, gather across hosts), verified, reloaded byte-identical on" \
  "$LOAD_LAYOUT on c+a+b; host b lost, its ranks restored on c from memory (buddy copies on a;" \
  "on $PP_LAYOUT read by the trainer itself)"
