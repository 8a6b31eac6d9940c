#!/usr/bin/env python3
"""Tests of scripts/doc-examples, the runner of the documentation's shell
examples: markers, what a run block becomes, and a broken example failing.

    BT_BLUTRAIN_EXE=build/blutrain python3 tests/scripts/test_doc_examples.py
"""
import importlib.machinery
import importlib.util
import os
import subprocess
import sys
import tempfile
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUNNER = os.path.join(REPO, "scripts", "doc-examples")
BLUTRAIN = os.environ.get("BT_BLUTRAIN_EXE", os.path.join(REPO, "build", "blutrain"))


def load_runner():
    loader = importlib.machinery.SourceFileLoader("doc_examples", RUNNER)
    spec = importlib.util.spec_from_loader("doc_examples", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


de = load_runner()


class Markdown:
    """A markdown file in a temporary folder."""

    def __init__(self, test, text):
        self.dir = tempfile.TemporaryDirectory(prefix="bt-doc-examples-test-")
        test.addCleanup(self.dir.cleanup)
        self.path = os.path.join(self.dir.name, "EXAMPLE.md")
        with open(self.path, "w", encoding="utf-8") as f:
            f.write(text)

    def run(self, *extra):
        p = subprocess.run([sys.executable, RUNNER, "--blutrain", BLUTRAIN, "--no-data", *extra, self.path],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
        return p.returncode, p.stdout.decode("utf-8", "replace")


class Extraction(unittest.TestCase):
    def test_blocks_markers_and_lines(self):
        md = Markdown(self, "# t\n\n<!-- example: run -->\n```sh\necho one\n```\n\ntext\n\n```bash\necho two\n```\n"
                      "<!-- example: skip: needs a GPU -->\n\n```sh\nexit 3\n```\n```text\nnot shell\n```\n")
        blocks = de.extract(md.path)
        self.assertEqual([(b.line, b.lines, b.marker) for b in blocks],
                         [(4, ["echo one"], "run"), (10, ["echo two"], None),
                          (15, ["exit 3"], "skip: needs a GPU")])
        self.assertEqual(de.parse_marker(blocks[0]), ("run", []))
        self.assertEqual(de.parse_marker(blocks[2]), ("skip", "needs a GPU"))
        with self.assertRaisesRegex(ValueError, "without a marker"):
            de.parse_marker(blocks[1])

    def test_markers_with_left_out_lines(self):
        b = de.Block("x.md", 1, [], "run; without scripts/test: CI runs it; without scancel: a cluster")
        self.assertEqual(de.parse_marker(b), ("run", [("scripts/test", "CI runs it"), ("scancel", "a cluster")]))
        b.marker = "runn"
        with self.assertRaisesRegex(ValueError, "unknown marker 'runn'"):
            de.parse_marker(b)

    def test_quick_options_go_to_training_commands_only(self):
        q = "--set train.steps=3"
        self.assertEqual(de.with_quick("blutrain train --set a=1", q), "blutrain train --set a=1 " + q)
        self.assertEqual(
            de.with_quick("build-release/blutrain launch --nproc 2 -- train --set a=1 && blutrain ckpt ls c", q),
            "build-release/blutrain launch --nproc 2 -- train --set a=1 " + q + " && blutrain ckpt ls c")
        self.assertEqual(de.with_quick("scripts/quickstart     # the main job", q),
                         "scripts/quickstart " + q + "     # the main job")
        self.assertEqual(de.with_quick("blutrain ckpt verify ckpt", q), "blutrain ckpt verify ckpt")
        self.assertEqual(de.with_quick("blutrain sample --weights w.h5 > out.txt", q),
                         "blutrain sample --weights w.h5 > out.txt")

    def test_continuations_heredocs_and_left_out_lines(self):
        script, dropped = de.script_of(
            ["blutrain launch --nproc 2 -- train \\", "    --set a=1", "cat > j.yaml <<'YAML'",
             "set: [blutrain train]", "YAML", "scripts/test   # all of it"], [("scripts/test", "CI")], "Q")
        self.assertEqual(script, "blutrain launch --nproc 2 -- train     --set a=1 Q\ncat > j.yaml <<'YAML'\n"
                                 "set: [blutrain train]\nYAML\n")
        self.assertEqual(dropped, [("scripts/test   # all of it", "CI")])


@unittest.skipUnless(os.access(BLUTRAIN, os.X_OK), f"no blutrain at {BLUTRAIN}: set BT_BLUTRAIN_EXE")
class Running(unittest.TestCase):
    def test_a_good_block_passes_and_skips_are_said(self):
        md = Markdown(self, "<!-- example: run -->\n```sh\nblutrain ckpt --help > help.txt\ngrep -q 'a root (checkpoint.dir)' help.txt\ntest -L configs\n```\n\n"
                      "<!-- example: skip: needs a GPU -->\n```sh\nexit 3\n```\n")
        rc, out = md.run()
        self.assertEqual(rc, 0, out)
        self.assertIn("EXAMPLE.md:2: ok", out)
        self.assertIn("EXAMPLE.md:9: skipped: needs a GPU", out)
        self.assertIn("1 block(s) run, 1 skipped, 0 failed", out)

    def test_a_block_without_a_marker_fails(self):
        rc, out = Markdown(self, "```sh\ntrue\n```\n").run()
        self.assertEqual(rc, 1, out)
        self.assertIn("EXAMPLE.md:1: a shell block without a marker", out)

    def test_a_broken_copy_of_the_readme_fails(self):
        """The README's "Several processes" example with a strategy that does not exist."""
        block = next(b for b in de.extract(os.path.join(REPO, "README.md"))
                     if any("dist.strategy=zero1" in line for line in b.lines))
        self.assertEqual(block.marker, "run")
        broken = [line.replace("zero1", "zero9") for line in block.lines]
        md = Markdown(self, "<!-- example: run -->\n```sh\n" + "\n".join(broken) + "\n```\n")
        rc, out = md.run()
        self.assertEqual(rc, 1, out)
        self.assertIn("EXAMPLE.md:2: FAILED", out)
        self.assertIn("dist.strategy must be ddp, zero1, zero2 or zero3, got 'zero9'", out)
        self.assertIn("1 failed: ", out)


if __name__ == "__main__":
    unittest.main(verbosity=2)
