"""Enter the sandbox, then exec the untrusted program (run by path: stdlib only, no lemur).

    python -I -S jail.py FD  (FD: an inherited file holding the spec dict, marshal-ed)

lemur.eval.sandbox.run starts this script instead of the program itself so that no
`preexec_fn` runs in the (multi-threaded) evaluating process. In order, it:
1. dies with the evaluator: a parent-death signal (SIGTERM, caught: `jail_run.abandon`
   kills the run and, the evaluator gone, removes the run's cgroups and directory), then a
   check that the evaluator is still its parent (it may have died before that);
2. reads the spec, and overwrites its command line with "lemur-jail" (the namespace's
   init, a fork of it, is pid 1 to the program: its /proc/1/cmdline shows nothing);
3. unshares the network namespace (a loopback interface, down), the pid and IPC
   namespaces; without root, a user namespace as well;
4. forks the run's first process, which joins the run's cgroups (this one stays out, to
   kill them). With `mountns` it is the pid namespace's init: in a mount namespace of its
   own, it builds the run's root (`build_root`), forks the program, reaps orphans, and
   exits with the program's status (the kernel then kills the rest of the namespace);
   else it is the program;
5. the program drops to the run's own uid and gid (root only), joins a new, empty session
   keyring, moves the report channel (if any) to fd 3, sets no_new_privs, a parent-death
   signal and the resource limits, and execs in `cwd` with a minimal environment.
Any failure exits with status 125 and one line on stderr starting with "lemur-jail:".
docs/eval.md (the sandbox) says what each step keeps out.
"""

import os
import sys

if __name__ == "__main__":
    # -I leaves this folder off sys.path. The work is in the module beside this script
    # (jail_run): imported, its bytecode is cached; a script is compiled anew at every start.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import jail_run

    del sys.path[0]
    jail_run.main()
