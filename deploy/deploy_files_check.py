"""Checks that Tessera's deployment files and operator guide name only real flags.

Usage: deploy_files_check.py --coordinator=BIN --agent=BIN --cli=BIN FILE...

Each binary's flags come from its own `--helpfull`. A flag is checked against the binary that
receives it wherever the file's structure says which one that is:
  *.service      Exec*= command lines; the expanded ExecStart (Environment=, EnvironmentFile=
                 from deploy/config/, %i = 0) must also parse: `BIN ... --only_check_args`;
  *.flags        every line (`coordinator.flags` -> tessera-coordinator); the file must parse
                 with --flagfile, also with its commented-out `#--flag` lines enabled;
  *.env          values of TESSERA_<AGENT|COORDINATOR>_FLAGS (`agent.env` -> tessera-agent);
  *.yaml         container command/args (with PyYAML; also with the comment blocks marked
                 `# TLS` enabled), which must parse with `$(VAR)` set; plus consistency:
                 mounts name declared volumes, TESSERA_AGENT is the agent's socket on a
                 shared volume, /dev/shm is a shared memory-backed volume, agents mount the
                 coordinator's storage root at the same path, --coordinator names a Service;
  shell, docs    command lines (docs: fenced sh blocks) that run a Tessera binary.
Anywhere else (comments, prose) a `--name` containing an underscore must be a flag of one of
the binaries: Slurm, kubectl and systemd options use hyphens, absl flags underscores.

Prints one line per problem; exits 1 if there was any, 0 otherwise.
"""

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile

try:
    import yaml
except ImportError:  # Debian's python3-yaml is usually there; without it YAML gets the text check.
    yaml = None

BINARIES = ("tessera-coordinator", "tessera-agent", "tessera")
# absl's own flags: parse.cc lists some in --helpfull, the usage flags it handles itself.
ABSL_BUILTIN = {"help", "helpfull", "helpshort", "helppackage", "helpon", "helpmatch", "version",
                "only_check_args", "flagfile", "fromenv", "tryfromenv", "undefok"}
FLAG_TOKEN = re.compile(r"^--?([A-Za-z][A-Za-z0-9_]*)(=.*)?$")
PROSE_FLAG = re.compile(r"(?<![\w-])--([A-Za-z][A-Za-z0-9_]*_[A-Za-z0-9_]*)(?![\w-])")
CONFIG_DIR = "deploy/config"

problems = []


def problem(path, message):
    problems.append("%s: %s" % (path, message))


class Binary:
    def __init__(self, name, path):
        self.name = name
        self.path = path
        out = subprocess.run([path, "--helpfull"], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, universal_newlines=True).stdout
        self.flags = {}
        for m in re.finditer(r"^    --([A-Za-z0-9_]+) .*?default: (.*?);$", out, re.M | re.S):
            self.flags[m.group(1)] = m.group(2)
        if len(self.flags) < 5:
            sys.exit("%s --helpfull listed %d flags: cannot check against it" % (path,
                                                                               len(self.flags)))

    def has(self, name):
        if name in self.flags or name in ABSL_BUILTIN:
            return True
        return name.startswith("no") and self.flags.get(name[2:]) in ("true", "false")

    def check_args(self, path, where, args):
        """Every --flag in args must be one of ours."""
        for arg in args:
            m = FLAG_TOKEN.match(arg)
            if m and arg.startswith("--") and not self.has(m.group(1)):
                problem(path, "%s: %s has no flag --%s" % (where, self.name, m.group(1)))

    def parses(self, path, where, args):
        """absl accepts args (names and values) without running the program."""
        result = subprocess.run([self.path] + list(args) + ["--only_check_args"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                universal_newlines=True)
        if result.returncode != 0:
            problem(path, "%s: %s does not accept %s: %s" % (
                where, self.name, " ".join(args), result.stdout.strip()))


def binary_of(token, binaries):
    """The binary a command word runs ("$BIN/tessera-agent" -> tessera-agent), or None."""
    return binaries.get(os.path.basename(token.strip("\"'")))


def check_prose(path, text, binaries):
    for m in PROSE_FLAG.finditer(text):
        if not any(b.has(m.group(1)) for b in binaries.values()):
            problem(path, "--%s is not a flag of %s" % (m.group(1), ", ".join(BINARIES)))


def check_shell_line(path, where, line, binaries):
    """A shell command line: args after a Tessera binary, up to an operator, are its flags."""
    try:
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lexer.commenters = ""  # callers strip comments; '#' inside ${1#*=} is no comment
        tokens = list(lexer)
    except ValueError:
        problem(path, "%s: cannot split %r" % (where, line))
        return
    current = None
    for token in tokens:
        if token and set(token) <= set("&|;<>()"):
            current = None
            continue
        binary = binary_of(token, binaries)
        if binary is not None:
            current = binary
        elif current is not None:
            current.check_args(path, where, [token])


def flag_values(text, var):
    """Values assigned to `var` (NAME=value or NAME="value") in text."""
    return [" ".join(shlex.split(m.group(1)))
            for m in re.finditer(r"(?m)^\s*(?:export\s+)?%s=(.*)$" % var, text)]


def flags_var_binary(binaries):
    return {"TESSERA_AGENT_FLAGS": binaries["tessera-agent"],
            "TESSERA_COORDINATOR_FLAGS": binaries["tessera-coordinator"]}


# ---- systemd units -------------------------------------------------------------------------

def read_env_file(path):
    env = {}
    for line in open(path):
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        name, value = line.split("=", 1)
        env[name.strip()] = " ".join(shlex.split(value)) if value.strip() else ""
    return env


def config_file(etc_path):
    """/etc/tessera/X -> deploy/config/X if that example exists."""
    if etc_path.startswith("/etc/tessera/"):
        local = os.path.join(CONFIG_DIR, etc_path[len("/etc/tessera/"):])
        if os.path.exists(local):
            return local
    return None


def expand_systemd(word, env):
    def var(m):
        return env.get(m.group(1) or m.group(2), "")
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", var, word)


def check_unit(path, text, binaries):
    lines = text.replace("\\\n", " ").splitlines()
    env = {}
    for line in lines:
        if line.startswith("Environment="):
            for item in shlex.split(line[len("Environment="):]):
                name, _, value = item.partition("=")
                env[name] = value
    for line in lines:
        if not line.startswith("EnvironmentFile="):
            continue
        name = line[len("EnvironmentFile="):].strip()
        optional = name.startswith("-")
        name = name.lstrip("-").replace("%i", "0")
        local = config_file(name)
        if local is not None:
            env.update(read_env_file(local))
        elif not optional:
            problem(path, "EnvironmentFile=%s has no example in %s" % (name, CONFIG_DIR))
    for line in lines:
        m = re.match(r"^(Exec\w+)=[-@:+!]*(.*)$", line)
        if not m:
            continue
        words = shlex.split(m.group(2))
        binary = binary_of(words[0], binaries)
        if binary is None:
            continue
        binary.check_args(path, m.group(1), words[1:])
        for ref in re.findall(r"\$\{(\w+)\}|\$(\w+)", m.group(2)):
            if (ref[0] or ref[1]) not in env:
                problem(path, "%s uses $%s, which neither Environment= nor an EnvironmentFile= "
                        "example sets" % (m.group(1), ref[0] or ref[1]))
        args = []
        for word in words[1:]:
            word = word.replace("%i", "0")
            if re.fullmatch(r"\$\w+", word):  # "$VAR" alone: split into words
                args.extend(expand_systemd(word, env).split())
                continue
            word = expand_systemd(word, env)
            flag = re.match(r"^--flagfile=(.*)$", word)
            if flag and config_file(flag.group(1)):
                word = "--flagfile=" + config_file(flag.group(1))
            args.append(word)
        binary.check_args(path, m.group(1) + " (expanded)", args)
        binary.parses(path, m.group(1), args)
    check_prose(path, "\n".join(l for l in lines if l.startswith("#")), binaries)


# ---- flag files and env files --------------------------------------------------------------

def check_flagfile(path, text, binaries):
    binary = binaries.get("tessera-" + os.path.basename(path).split(".")[0])
    if binary is None:
        problem(path, "cannot tell which binary reads it (name it <coordinator|agent>.flags)")
        return
    for n, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if not stripped.startswith("--"):
            problem(path, "line %d is neither a flag nor a comment: %r" % (n, line))
        binary.check_args(path, "line %d" % n, [stripped])
    binary.parses(path, "as --flagfile", ["--flagfile=" + path])
    enabled = re.sub(r"(?m)^#(--)", r"\1", text)
    if enabled != text:
        with tempfile.NamedTemporaryFile("w", suffix=".flags", delete=False) as f:
            f.write(enabled)
        for n, line in enumerate(enabled.splitlines(), 1):
            if line.startswith("--"):
                binary.check_args(path, "line %d (uncommented)" % n, [line.strip()])
        binary.parses(path, "as --flagfile with its #-- lines uncommented",
                      ["--flagfile=" + f.name])
        os.unlink(f.name)
    check_prose(path, "\n".join(l for l in text.splitlines() if l.startswith("# ")), binaries)


def check_env(path, text, binaries):
    for var, binary in flags_var_binary(binaries).items():
        for value in flag_values(text, var):
            args = value.split()
            binary.check_args(path, var, args)
            binary.parses(path, var, args)
    check_prose(path, text, binaries)


# ---- Kubernetes ----------------------------------------------------------------------------

def enable_marked_blocks(text, marker):
    """Uncomments the comment lines that follow a `# <marker>` line (at its indentation)."""
    out, indent = [], None
    for line in text.splitlines():
        m = re.match(r"^(\s*)# ?(.*)$", line)
        if m and indent is not None and m.group(1) == indent and not m.group(2).startswith(
                marker):
            out.append(indent + m.group(2))
            continue
        indent = m.group(1) if m and m.group(2).startswith(marker) else None
        out.append(line)
    return "\n".join(out) + "\n"


def pod_specs(doc):
    """(pod spec, volume claim template names) of a workload or Pod document."""
    if not isinstance(doc, dict):
        return []
    kind = doc.get("kind")
    spec = doc.get("spec") or {}
    if kind == "Pod":
        return [(spec, set())]
    template = (spec.get("template") or {}).get("spec")
    if kind == "CronJob":
        template = (((spec.get("jobTemplate") or {}).get("spec") or {}).get("template") or
                    {}).get("spec")
    if template is None:
        return []
    claims = {t["metadata"]["name"] for t in spec.get("volumeClaimTemplates") or []}
    return [(template, claims)]


def arg_value(args, name):
    for arg in args:
        if arg.startswith("--%s=" % name):
            return arg.split("=", 1)[1]
    return None


def mount_of(container, path):
    """(volume name, mount path) of the mount holding path in the container, or (None, None)."""
    best = (None, None)
    for mount in container.get("volumeMounts") or []:
        mp = mount["mountPath"].rstrip("/")
        if (path == mp or path.startswith(mp + "/")) and len(mp) >= len(best[1] or ""):
            best = (mount["name"], mp)
    return best


class K8sModel:
    """What the YAML files declare, for the cross-file checks."""

    def __init__(self):
        self.services = {}       # name -> set of ports
        self.storage_roots = []  # (path, where, storage root, claim name)
        self.agents = []         # (path, where, container, volumes by name, args)


def check_container(path, where, container, binaries):
    command = container.get("command") or []
    args = [str(a) for a in container.get("args") or []]
    words = [str(w) for w in command] + args
    if not words:
        return None, []
    binary = binary_of(words[0], binaries)
    if binary is None:
        return None, []
    binary.check_args(path, where, words[1:])
    env = {e["name"]: str(e.get("value", "0")) for e in container.get("env") or []}
    expanded = [re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), "$(%s)" % m.group(1)), w)
                for w in words[1:]]
    for word, original in zip(expanded, words[1:]):
        if "$(" in word:
            problem(path, "%s: %s refers to a variable the container does not define" % (
                where, original))
    binary.parses(path, where, expanded)
    return binary, words[1:]


def check_pod(path, kind_name, spec, claims, binaries, model):
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    containers = [("initContainers", c) for c in spec.get("initContainers") or []] + \
                 [("containers", c) for c in spec.get("containers") or []]
    agents = []
    for group, container in containers:
        where = "%s %s %s" % (kind_name, group, container.get("name"))
        for mount in container.get("volumeMounts") or []:
            if mount["name"] not in volumes and mount["name"] not in claims:
                problem(path, "%s mounts %s, which the pod does not declare" % (
                    where, mount["name"]))
        binary, args = check_container(path, where, container, binaries)
        if binary is None:
            continue
        if binary.name == "tessera-coordinator":
            root = arg_value(args, "storage_root")
            volume, _ = mount_of(container, root or "")
            claim = ((volumes.get(volume) or {}).get("persistentVolumeClaim") or {}).get(
                "claimName")
            if claim is None:
                problem(path, "%s: --storage_root=%s is not on a PersistentVolumeClaim mount" % (
                    where, root))
            model.storage_roots.append((path, where, root, claim))
        if binary.name == "tessera-agent":
            agents.append((where, container, args))
            model.agents.append((path, where, container, volumes, args))
    for where, agent, args in agents:
        socket = arg_value(args, "socket")
        if socket is None:
            problem(path, "%s: no --socket (its default is under /tmp, not shared)" % where)
            continue
        sock_volume, _ = mount_of(agent, socket)
        shm_volume, shm_path = mount_of(agent, "/dev/shm")
        if shm_path != "/dev/shm" or ((volumes.get(shm_volume) or {}).get("emptyDir") or {}).get(
                "medium") != "Memory":
            problem(path, "%s: /dev/shm must be a memory-backed emptyDir volume" % where)
        for group, other in containers:
            if other is agent:
                continue
            env = {e["name"]: e.get("value") for e in other.get("env") or []}
            if "TESSERA_AGENT" not in env:
                continue
            name = "%s %s %s" % (kind_name, group, other.get("name"))
            if env["TESSERA_AGENT"] != socket:
                problem(path, "%s: TESSERA_AGENT=%s but the agent's --socket=%s" % (
                    name, env["TESSERA_AGENT"], socket))
            if sock_volume is None or mount_of(other, socket)[0] != sock_volume:
                problem(path, "%s does not share the volume of the agent's socket" % name)
            if mount_of(other, "/dev/shm") != (shm_volume, "/dev/shm"):
                problem(path, "%s does not mount the agent's /dev/shm volume" % name)


def check_yaml(path, text, binaries, model):
    if yaml is None:
        check_prose(path, text, binaries)
        return
    variants = [("", text)]
    enabled = enable_marked_blocks(text, "TLS")
    if enabled.rstrip("\n") != text.rstrip("\n"):
        variants.append((" (TLS blocks enabled)", enabled))
    for label, variant in variants:
        try:
            docs = [d for d in yaml.safe_load_all(variant) if d is not None]
        except yaml.YAMLError as e:
            problem(path, "not valid YAML%s: %s" % (label, e))
            continue
        for doc in docs:
            for key in ("apiVersion", "kind", "metadata"):
                if key not in doc:
                    problem(path, "a document without %s%s" % (key, label))
            name = "%s %s%s" % (doc.get("kind"), (doc.get("metadata") or {}).get("name"), label)
            if doc.get("kind") == "Service" and not label:
                model.services[doc["metadata"]["name"]] = {
                    p.get("port") for p in doc["spec"].get("ports") or []}
            for spec, claims in pod_specs(doc):
                check_pod(path, name, spec, claims, binaries, model if not label else K8sModel())
    check_prose(path, "\n".join(l for l in text.splitlines() if l.lstrip().startswith("#")),
                binaries)


def check_k8s_model(model):
    for path, where, container, volumes, args in model.agents:
        address = arg_value(args, "coordinator") or ""
        host, _, port = address.rpartition(":")
        service = host.split(".")[0]
        if service not in model.services or not port.isdigit() or int(
                port) not in model.services[service]:
            problem(path, "%s: --coordinator=%s is not a Service port of these manifests" % (
                where, address))
        for root_path, root_where, root, claim in model.storage_roots:
            volume, mount_path = mount_of(container, root or "")
            agent_claim = ((volumes.get(volume) or {}).get("persistentVolumeClaim") or
                           {}).get("claimName")
            if mount_path != root or agent_claim != claim:
                problem(path, "%s must mount claim %s at %s, the coordinator's --storage_root "
                        "(%s)" % (where, claim, root, root_path))


# ---- shell scripts and docs ----------------------------------------------------------------

def logical_lines(text):
    """(line number, line) with backslash continuations joined."""
    out, buf, start = [], "", None
    for n, line in enumerate(text.splitlines(), 1):
        if start is None:
            start = n
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        out.append((start, buf + line))
        buf, start = "", None
    if buf:
        out.append((start, buf))
    return out


def check_shell(path, text, binaries):
    prose = []
    for n, line in logical_lines(text):
        stripped = line.strip()
        if stripped.startswith("#SBATCH"):
            continue
        if stripped.startswith("#"):
            prose.append(stripped)
            continue
        check_shell_line(path, "line %d" % n, re.sub(r"\s#\s.*$", "", line), binaries)
    for var, binary in flags_var_binary(binaries).items():
        for m in re.finditer(r'%s="([^"$]*)"' % var, text):
            binary.check_args(path, var, m.group(1).split())
    check_prose(path, "\n".join(prose), binaries)


def check_markdown(path, text, binaries):
    prose, fence, block = [], None, []
    for n, line in enumerate(text.splitlines(), 1):
        m = re.match(r"^\s*```(\w*)", line)
        if m and fence is None:
            fence, block = m.group(1), []
        elif m:
            if fence in ("", "sh", "bash", "shell", "console"):
                for first, command in logical_lines("\n".join(block)):
                    command = re.sub(r"(^|\s)#(\s.*)?$", "", re.sub(r"^\s*\$ ", "", command))
                    check_shell_line(path, "line %d" % (block_start + first), command, binaries)
            else:
                prose.extend(block)
            fence = None
        elif fence is not None:
            if not block:
                block_start = n - 1
            block.append(line)
        else:
            prose.append(line)
    for m in re.finditer(r"`([^`]+)`", "\n".join(prose)):
        check_shell_line(path, "`%s`" % m.group(1), m.group(1), binaries)
    check_prose(path, text, binaries)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--coordinator", required=True)
    parser.add_argument("--agent", required=True)
    parser.add_argument("--cli", required=True)
    parser.add_argument("files", nargs="+")
    opts = parser.parse_args()
    binaries = {"tessera-coordinator": Binary("tessera-coordinator", opts.coordinator),
                "tessera-agent": Binary("tessera-agent", opts.agent),
                "tessera": Binary("tessera", opts.cli)}
    model = K8sModel()
    yaml_files = 0
    for path in opts.files:
        text = open(path).read()
        base = os.path.basename(path)
        if base.endswith(".service"):
            check_unit(path, text, binaries)
        elif base.endswith(".flags"):
            check_flagfile(path, text, binaries)
        elif base.endswith(".env"):
            check_env(path, text, binaries)
        elif base.endswith((".yaml", ".yml")):
            check_yaml(path, text, binaries, model)
            yaml_files += 1
        elif base.endswith((".sh", ".sbatch")):
            check_shell(path, text, binaries)
        elif base.endswith(".md"):
            check_markdown(path, text, binaries)
        else:
            problem(path, "no rule for this kind of file")
    if yaml is None:
        print("note: PyYAML is not installed: Kubernetes manifests got the text check only")
    elif yaml_files:
        check_k8s_model(model)
    for p in problems:
        print("PROBLEM: " + p)
    print("checked %d files: %d problems" % (len(opts.files), len(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
