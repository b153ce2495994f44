"""Build hook: generates the gRPC stubs from toolrun's proto with grpcio-tools.

The generated modules (``toolrun/v1/toolrun_pb2.py``, ``toolrun_pb2.pyi`` and
``toolrun_pb2_grpc.py``) are never committed: every build makes them from
``proto/toolrun/v1/toolrun.proto``, so the client always matches the proto it ships with.
Protoc runs with the proto root as include path, so the generated ``from toolrun.v1 import
toolrun_pb2`` resolves to this package's ``toolrun.v1``.

The proto is looked up at ``../../proto`` (this directory inside the toolrun repository:
``pip install ./clients/python``) and then at ``./proto`` (an sdist, which carries a copy).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py as _build_py
from setuptools.command.sdist import sdist as _sdist

HERE = Path(__file__).resolve().parent
PROTO_REL = Path("toolrun") / "v1" / "toolrun.proto"
GENERATED = ("toolrun_pb2.py", "toolrun_pb2.pyi", "toolrun_pb2_grpc.py")


def proto_root() -> Path:
    """The directory holding ``toolrun/v1/toolrun.proto``; a clear error when there is none."""
    candidates = [HERE.parent.parent / "proto", HERE / "proto"]
    for root in candidates:
        if (root / PROTO_REL).is_file():
            return root
    tried = ", ".join(str(c / PROTO_REL) for c in candidates)
    raise SystemExit(
        f"toolrun SDK build: cannot find the proto {PROTO_REL} (tried {tried}). "
        "Build from the toolrun repository (pip install ./clients/python) or from an sdist "
        "made there."
    )


def generate(out_dir: Path) -> None:
    """Runs protoc (grpcio-tools) on the proto, writing the stubs under ``out_dir``."""
    try:
        from grpc_tools import protoc
    except ImportError as e:  # pragma: no cover - the build requires it
        raise SystemExit(
            "toolrun SDK build: grpcio-tools is required to generate the stubs "
            "(it is in pyproject.toml's build-system.requires)"
        ) from e
    root = proto_root()
    out_dir.mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"--proto_path={root}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        str(PROTO_REL),
    ]
    code = protoc.main(args)
    if code != 0:
        raise SystemExit(f"toolrun SDK build: protoc failed (exit {code}) on {root / PROTO_REL}")
    for name in GENERATED:
        if not (out_dir / "toolrun" / "v1" / name).is_file():
            raise SystemExit(f"toolrun SDK build: protoc did not write toolrun/v1/{name}")


class build_py(_build_py):
    """Copies the sources, then generates the stubs beside them."""

    def run(self) -> None:
        super().run()
        # An editable install imports from src/: generate there (git ignores the files).
        out = HERE / "src" if getattr(self, "editable_mode", False) else Path(self.build_lib)
        generate(out)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:  # type: ignore[override]
        outputs = list(super().get_outputs(include_bytecode))
        if not getattr(self, "editable_mode", False):
            base = Path(self.build_lib) / "toolrun" / "v1"
            outputs += [str(base / name) for name in GENERATED]
        return outputs


class sdist(_sdist):
    """Carries the proto inside the sdist, so a wheel can be built from it alone."""

    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        super().make_release_tree(base_dir, files)
        dest = Path(base_dir) / "proto" / PROTO_REL
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(proto_root() / PROTO_REL, dest)


setup(cmdclass={"build_py": build_py, "sdist": sdist})
