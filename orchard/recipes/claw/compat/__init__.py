"""Packages that task folders of other benchmarks import, written for Orchard: `claw_eval` (the
grading interface of Claw-Eval's graders). This folder goes on `sys.path` only while a grader is
loaded and run (`orchard.recipes.claw.claweval`); nothing else imports from here."""
