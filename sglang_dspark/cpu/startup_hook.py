"""Install or remove the interpreter start-up hook of the CPU platform (a one-line ``.pth`` file).

    python -m sglang_dspark.cpu.startup_hook install|uninstall|status

``scripts/install.sh cpu`` runs ``install``. The hook itself (``sglang_dspark.cpu.startup``) is inert unless SGLang runs
on a CPU, and the line tolerates this package being uninstalled.
"""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

PTH_NAME = "sglang_dspark_cpu.pth"
PTH_LINE = (
    'import sys; exec("try:\\n import sglang_dspark.cpu.startup\\nexcept ImportError:\\n pass")\n'
)


def pth_path() -> Path:
    return Path(sysconfig.get_paths()["purelib"]) / PTH_NAME


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    command = args[0] if args else "status"
    path = pth_path()
    if command == "install":
        path.write_text(PTH_LINE)
        print(f"[sglang-dspark] CPU platform start-up hook installed: {path}")
    elif command == "uninstall":
        path.unlink(missing_ok=True)
        print(f"[sglang-dspark] CPU platform start-up hook removed: {path}")
    elif command == "status":
        print(f"{path}: {'installed' if path.exists() else 'not installed'}")
    else:
        print("usage: python -m sglang_dspark.cpu.startup_hook install|uninstall|status", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
