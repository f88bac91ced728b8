"""The client as its users install it: the wheel built from client/."""
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

CLIENT = Path(__file__).resolve().parents[2] / "client"


def test_the_wheel_carries_the_marker_that_makes_its_type_hints_count(tmp_path):
    # given: the client's source, copied so that the build leaves nothing in the checkout
    source = shutil.copytree(CLIENT, tmp_path / "client",
                             ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    # when: built as pip builds it for its users
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", str(source),
                    "-w", str(tmp_path / "dist")], check=True, timeout=300, capture_output=True)
    # then: type checkers read its hints (PEP 561), where without the marker every result was Any
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    assert "switchboard_client/py.typed" in zipfile.ZipFile(wheel).namelist()
