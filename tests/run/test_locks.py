"""Every results writer takes the run lock (issue 36)."""

import subprocess
import sys
import textwrap

import pytest

from workbench.run import locks, results

_HOLDER = textwrap.dedent('''
    import sys
    from workbench.run import locks
    locks.lock_run(sys.argv[1])
    print("locked", flush=True)
    sys.stdin.readline()
''')


def test_every_writer_refuses_a_run_another_process_owns():
    run = results.create_run()
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(run)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        import plotly.graph_objects as go

        writers = {
            "save_figure": lambda: results.save_figure(run, "f", go.Figure()),
            "save_text": lambda: results.save_text(run, "answers/a.txt", "x"),
            "mark_invalid": lambda: results.mark_invalid(run, ["p"], "why"),
            "begin_session": lambda: results.begin_session(run),
            "save_finding": lambda: results.save_finding(run, "e", "a sentence"),
            "update_manifest": lambda: results.update_manifest(run, status="x"),
        }
        for name, write in writers.items():
            with pytest.raises(locks.RunLockedError):
                write()
                pytest.fail(f"{name} wrote a run another process owns")
    finally:
        holder.stdin.write("\n")
        holder.stdin.close()
        holder.wait(30)
