"""Reads the JSON that `tessera <command> --json` prints, for tests/soak/soak_test.sh.

  soak_state.py checkpoints FILE   one line per committed checkpoint: "STEP DIR", newest first
  soak_state.py session FILE       "STEP STATE CODE MESSAGE" of a SessionStatus
  soak_state.py job FILE JOB       "LATEST_STEP CURRENT_SESSION_OR_- ALIVE_AGENTS"
  soak_state.py dead FILE          the ranks of the agents listed as not alive, one line

proto3 JSON prints int64 as strings and leaves out nothing (the CLI prints default values);
both are handled here.
"""
import json
import sys


def main():
    command, path = sys.argv[1], sys.argv[2]
    with open(path) as f:
        doc = json.load(f)
    if command == "checkpoints":
        for c in doc.get("checkpoints", []):
            print(int(c["step"]), c["dir"])
    elif command == "session":
        error = doc.get("error") or {}
        code = error.get("code") or "-"
        message = " ".join((error.get("message") or "").split())
        print(int(doc.get("step", -1)), doc.get("state") or "-", code, message)
    elif command == "job":
        for job in doc.get("jobs", []):
            if job.get("job_id") == sys.argv[3]:
                print(int(job.get("latest_committed_step", -1)),
                      job.get("current_session_id") or "-", int(job.get("agents_alive", 0)))
                return 0
        print(-1, "-", 0)
    elif command == "dead":
        print(" ".join(str(int((a.get("coord") or {}).get("rank", 0)))
                       for a in doc.get("agents", []) if not a.get("alive")))
    else:
        print("unknown command " + command, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
