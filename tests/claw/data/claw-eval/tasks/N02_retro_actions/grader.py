"""Grader of N02: N01's, for the retrospective's note and items (a peer grader, as Claw-Eval's
English tasks reuse their Chinese twins')."""

from claw_eval.graders.base import load_peer_grader

_Base = load_peer_grader("N01_meeting_actions")


class RetroActionsGrader(_Base):
    NOTE_ID = "n-201"
    ITEMS = ("invoice", "supplier")
    NOT_MINE = ("slides",)
