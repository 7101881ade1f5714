"""The simulated node's stand-in for DCGM's `dcgmi` (`programs`): run as a script, never imported.

It talks to a hostengine only where the container's `nv-hostengine` stand-in started one and
its (virtual) start delay passed; `discovery -l` lists the container's GPUs; `diag -r LEVEL
[-i ENTITIES] [-j]` prints a report of DCGM 4.x's JSON shape for them, Fail on the last test of
the level for a GPU whose `failure` the pod runner wrote, and exits 226 then (DCGM's
NVVS_ERROR), 0 otherwise. Without a hostengine it says so on stderr and exits 255, as dcgmi does.
"""

import json
import os
import sys


def read(state: str, name: str, default: str) -> str:
    try:
        with open(os.path.join(state, name)) as f:
            return f.read()
    except OSError:
        return default


def main(args: list[str]) -> int:
    state = os.environ["GPUHEALTH_SIM_CONTAINER"]
    host, entities, level, as_json, command = "localhost", None, 1, False, None
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--host":
            host, i = args[i + 1], i + 1
        elif a in ("-i", "--entity-id"):
            entities, i = args[i + 1].split(","), i + 1
        elif a in ("-r", "--run"):
            level, i = int(args[i + 1]), i + 1
        elif a in ("-j", "--json"):
            as_json = True
        elif command is None and not a.startswith("-"):
            command = a
        i += 1
    ready = read(state, "hostengine", "").strip()
    local = host.split(":")[0] in ("localhost", "127.0.0.1")
    if not (local and ready and int(read(state, "clock", "0").strip() or 0) >= int(ready)):
        print(f"Error: unable to establish a connection to the specified host: {host}", file=sys.stderr)
        print(
            "Error: Unable to connect to host engine. Host engine connection invalid/disconnected.",
            file=sys.stderr,
        )
        return 255
    gpus = json.loads(read(state, "gpus.json", "[]"))
    if command == "discovery":
        print(f"{len(gpus)} GPU(s) found.")
        for n, g in enumerate(gpus):
            print(f"| {n} | Device UUID: {g['uuid']} |")
        return 0
    if command != "diag":
        return 0
    ids = list(range(len(gpus)))
    if entities is not None:
        ids = [n for n, g in enumerate(gpus) if g["uuid"] in entities or str(n) in entities]
    if not ids:
        error = {"version": "4.2.3", "runtime_error": "No GPUs to run the diagnostic on"}
        print(json.dumps({"DCGM Diagnostic": error}))
        return 255
    tests = [("Deployment", "software")]
    if level >= 2:
        tests += [("Integration", "pcie"), ("Hardware", "memory")]
    if level >= 3:
        tests += [("Hardware", "diagnostic"), ("Stress", "targeted_stress"), ("Stress", "targeted_power")]
    categories: dict[str, list[object]] = {}
    failed = False
    for category, name in tests:
        results = []
        for n in ids:
            failure = gpus[n]["failure"]
            entry: dict[str, object] = {"entity_group": "GPU", "entity_group_id": 1, "entity_id": n}
            entry["status"] = "Pass"
            if failure and name == tests[-1][1]:
                failed = True
                entry["status"] = "Fail"
                entry["warnings"] = [
                    {"warning": failure, "error_id": 95, "error_category": 3, "error_severity": 2}
                ]
            results.append(entry)
        summary = "Fail" if any(r["status"] == "Fail" for r in results) else "Pass"
        test = {"name": name, "results": results, "test_summary": {"status": summary}}
        categories.setdefault(category, []).append(test)
    doc = {
        "DCGM Diagnostic": {"test_categories": [{"category": c, "tests": t} for c, t in categories.items()]},
        "entity_groups": [
            {"entity_group": "GPU", "entity_group_id": 1, "entities": [{"entity_id": n} for n in ids]}
        ],
        "metadata": {"version": "4.2.3"},
    }
    print(json.dumps(doc, indent=3) if as_json else "Successfully ran diagnostic for group.")
    return 226 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
