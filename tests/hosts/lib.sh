# Simulated hosts for the tests and benchmarks that need several machines (source it after
# deploy/lib/procs.sh, deploy/lib/cluster.sh and tests/skip.sh, with DIR set): Linux network
# namespaces, one per host, each joined by a veth pair to a bridge in a hub namespace, with its
# own private address in 10.77.0.0/24 and its own hostname (a UTS namespace per process).
# Storage is the shared filesystem (the namespaces share the mount namespace).
#
# Set before sourcing: HOSTS (array of host names) and ADDR (associative array: host ->
# address). Then: make_hosts builds them (or SKIPs visibly where the machine does not allow
# network namespaces); host_wrap, on and tessera run commands on a host; a trap deletes every
# namespace of this run on exit. Namespaces are named tsrh-<pid>-<random>-*, so parallel runs
# never collide.
#
# Links are shaped and cut with what the kernel offers everywhere: tbf (shape_link) and routes
# (cut_route). netem is not used: kernels built without sch_netem (the CI's among them) have no
# delay or loss qdisc, so loss and latency come from tessera-wire (tests/hosts/wire_main.cc, a
# userspace link over two TUN devices; join_through_wire). Decision 0045.
TAG=tsrh-$$-$RANDOM
NAMESPACES=()
WIRE_PIDS=()

hosts_cleanup() {
  local ns pid
  for pid in "${WIRE_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  stop_all
  for ns in "${NAMESPACES[@]}"; do
    # Anything still inside one of this run's namespaces was started by this run.
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null; done
    ip netns del "$ns" 2>/dev/null  # its veth ends go with it
  done
  # Staging regions of agents that had to be killed (the job id is this run's own).
  [ -z "${JOB:-}" ] || rm -f /dev/shm/tessera-"$JOB"-r*
  return 0
}
trap hosts_cleanup EXIT
trap 'exit 143' TERM INT

# Namespaces left by a run that was killed (its pid gone, nothing inside): removed.
for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^tsrh-[0-9]+-'); do
  pid=${ns#tsrh-}; pid=${pid%%-*}
  if ! kill -0 "$pid" 2>/dev/null && [ -z "$(ip netns pids "$ns" 2>/dev/null)" ]; then
    ip netns del "$ns" 2>/dev/null
  fi
done

ns_add() {
  local out
  out=$(ip netns add "$1" 2>&1) || skip "ip netns add is not allowed here: $out"
  NAMESPACES+=("$1")
}

# make_hosts: the hub and every host of HOSTS, each host's eth0 on the hub's bridge with its
# ADDR. Loopback is up on "coord" only (as a real host has it: the CLI there reaches the
# coordinator at the host's own address through lo); elsewhere it stays DOWN, as a new
# namespace has it, so an agent or trainer that dialled 127.0.0.1 fails. SKIPs (tests/skip.sh)
# without root, iproute2 or namespace support.
HUB=$TAG-hub
make_hosts() {
  local out h tool
  [ "$(id -u)" -eq 0 ] || skip "network namespaces need root (running as uid $(id -u))"
  for tool in ip ss unshare hostname; do
    command -v "$tool" >/dev/null || skip "$tool is not installed (iproute2/util-linux/hostname)"
  done
  ns_add "$HUB"
  out=$(ip -n "$HUB" link add br0 type bridge 2>&1) || skip "cannot create a bridge: $out"
  ip -n "$HUB" link set br0 up || fail "bridge up"
  for h in "${HOSTS[@]}"; do
    ns_add "$TAG-$h"
    out=$(ip -n "$HUB" link add "v-$h" type veth peer name eth0 netns "$TAG-$h" 2>&1) ||
      skip "cannot create a veth pair: $out"
    ip -n "$HUB" link set "v-$h" master br0 up || fail "v-$h up"
    ip -n "$TAG-$h" addr add "${ADDR[$h]}/24" dev eth0 || fail "address of $h"
    ip -n "$TAG-$h" link set eth0 up || fail "eth0 up on $h"
    # Loopback up, as on any real host: a host's processes reach one another at its own
    # address through lo (two agents of one node read each other's memory copies so). Nothing
    # may listen on 127.0.0.1 or a wildcard address; the tests check every listener.
    ip -n "$TAG-$h" link set lo up || fail "lo up on $h"
  done
  echo "hosts: $(for h in "${HOSTS[@]}"; do printf '%s=%s ' "$TAG-$h" "${ADDR[$h]}"; done)"
}

# host_wrap HOST: WRAP=(the command prefix that runs a command on HOST: its network namespace,
# its own hostname). Every step execs the next, so a background process's $! is the program's
# own pid and stop_process signals the program itself.
host_wrap() {
  WRAP=(ip netns exec "$TAG-$1" unshare --uts /bin/sh -c 'hostname "$0" && exec "$@"' "$TAG-$1")
}
# on HOST CMD...: runs CMD on HOST in the foreground.
on() {
  local WRAP
  host_wrap "$1"; shift
  "${WRAP[@]}" "$@"
}
tessera() { on coord "$BIN/client/cli/tessera" --coordinator="$(coordinator_address)" "$@"; }

# Ranks go round-robin over RANK_HOSTS (cluster.sh's place_rank, redefined).
RANK_HOSTS=(a b)
place_rank() {
  local h=${RANK_HOSTS[$(($1 % ${#RANK_HOSTS[@]}))]}
  host_wrap "$h"
  PLACE_WRAP=("${WRAP[@]}")
  PLACE_ADDR=${ADDR[$h]}
  PLACE_NODE=""  # the agent's default: its hostname, which differs per host
}
host_of_rank() { echo "${RANK_HOSTS[$(($1 % ${#RANK_HOSTS[@]}))]}"; }

# start_coordinator_on_coord [flags...]: the coordinator on host coord, listening on its address
# only; every other host of HOSTS reaches it.
start_coordinator_on_coord() {
  local h
  COORD_HOST=${ADDR[coord]}
  host_wrap coord
  COORD_WRAP=("${WRAP[@]}")
  start_coordinator "$@" || fail "coordinator"
  echo "coordinator on $(coordinator_address) in $TAG-coord"
  for h in "${HOSTS[@]}"; do
    [ "$h" = coord ] && continue
    reaches "$h" "${ADDR[coord]}" "$COORD_PORT" ||
      fail "host $h cannot reach the coordinator at $(coordinator_address)"
  done
}

# reaches HOST ADDRESS PORT: a TCP connection from HOST to ADDRESS:PORT opens within 10 s.
reaches() { on "$1" timeout 10 /bin/bash -c "exec 3<>/dev/tcp/$2/$3" 2>/dev/null; }

tx_bytes() { ip netns exec "$TAG-$1" cat /sys/class/net/eth0/statistics/tx_bytes; }

# cut_route FROM TO: packets HOST FROM sends to host TO are dropped (a blackhole route in
# FROM's namespace: no error, no reply, as a lost link looks); TO's packets to FROM still
# arrive. heal_route FROM TO undoes it.
cut_route() { ip -n "$TAG-$1" route add blackhole "${ADDR[$2]}/32" || fail "cut $1 -> $2"; }
heal_route() { ip -n "$TAG-$1" route del blackhole "${ADDR[$2]}/32" || fail "heal $1 -> $2"; }

# shape_link HOST RATE: HOST's link carries at most RATE (tc tbf, e.g. 2gbit) each way: on its
# eth0 (what it sends) and on the hub's end (what it receives).
shape_link() {
  local out
  for dev in "$TAG-$1 eth0" "$HUB v-$1"; do
    # shellcheck disable=SC2086
    out=$(ip netns exec ${dev% *} tc qdisc replace dev ${dev#* } root tbf rate "$2" \
      burst 1mb latency 20ms 2>&1) || skip "tc tbf is not available: $out"
  done
}

# join_through_wire HOST DELAY_MS LOSS_PERCENT: HOST (not in HOSTS; its ADDR in 10.77.1.0/24)
# reaches every other host only through tessera-wire (tests/hosts/wire_main.cc): each packet
# DELAY_MS late each way, LOSS_PERCENT of them dropped. The wire's two TUN devices: "wire" on
# HOST, "w-HOST" in the hub, which routes between it and the bridge (10.77.0.254).
join_through_wire() {
  local h=$1 log="$DIR/logs/wire-$1.log" out other
  ns_add "$TAG-$h"
  ip netns exec "$TAG-$h" "$BIN/tests/hosts/tessera-wire" --tun_a=wire --tun_b="w-$h" \
    --delay_ms="$2" --loss_percent="$3" 2>>"$log" &
  WIRE_PIDS+=($!)
  wait_for_line "$log" "tessera-wire: up" 10 || skip "no TUN devices here: $(cat "$log")"
  ip -n "$TAG-$h" link set "w-$h" netns "$HUB" || fail "moving w-$h to the hub"
  ip -n "$TAG-$h" addr add "${ADDR[$h]}" peer 10.77.1.1 dev wire || fail "address of $h"
  ip -n "$TAG-$h" link set wire up || fail "wire up on $h"
  ip -n "$TAG-$h" route add 10.77.0.0/24 dev wire || fail "route of $h"
  ip -n "$HUB" addr add 10.77.1.1 peer "${ADDR[$h]}" dev "w-$h" || fail "hub end of $h's wire"
  ip -n "$HUB" link set "w-$h" up || fail "w-$h up"
  if ! ip -n "$HUB" addr show br0 | grep -q 10.77.0.254; then
    ip -n "$HUB" addr add 10.77.0.254/24 dev br0 || fail "the hub's address"
    ip netns exec "$HUB" sh -c 'echo 1 >/proc/sys/net/ipv4/ip_forward' || fail "forwarding in the hub"
    for other in "${HOSTS[@]}"; do
      ip -n "$TAG-$other" route add 10.77.1.0/24 via 10.77.0.254 || fail "route of $other"
    done
  fi
  echo "host $TAG-$h=${ADDR[$h]} behind tessera-wire: $2 ms each way, $3 % loss"
}

# stop_wires: every wire stops and logs what it delivered and dropped.
stop_wires() {
  local pid
  for pid in "${WIRE_PIDS[@]}"; do stop_process "$pid" 10 >/dev/null; done
  WIRE_PIDS=()
}
