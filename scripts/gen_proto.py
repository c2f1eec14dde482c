"""Generate (or check) the Python modules of ``proto/*.proto``.

The generated modules are committed so that installing querycoord needs no
protobuf compiler; ``--check`` regenerates into a temporary directory and
fails when the committed files differ, so they can never drift from the
sources unnoticed.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"


def generate(out_root: Path) -> list[Path]:
    """Compile every proto from the repository root so imports read ``from proto import x_pb2``."""
    sources = sorted(PROTO_DIR.glob("*.proto"))
    (out_root / "proto").mkdir(parents=True, exist_ok=True)
    include = Path(protoc.__file__).parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{ROOT}",
        f"-I{include}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *[str(s.relative_to(ROOT)) for s in sources],
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    return sorted(p for p in (out_root / "proto").iterdir() if p.name.endswith((".py", ".pyi")))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if committed modules differ")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        generated = generate(Path(tmp))
        if args.check:
            stale = [
                g.name
                for g in generated
                if not (PROTO_DIR / g.name).exists() or not filecmp.cmp(g, PROTO_DIR / g.name, shallow=False)
            ]
            if stale:
                print(f"generated protobuf modules are stale: {stale}; run `make proto`", file=sys.stderr)
                return 1
            print(f"proto: {len(generated)} generated modules match their sources")
            return 0
        for g in generated:
            shutil.copy(g, PROTO_DIR / g.name)
        print(f"proto: wrote {len(generated)} modules")
    return 0


if __name__ == "__main__":
    sys.exit(main())
