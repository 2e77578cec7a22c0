"""SimpleNegotiation-v1: trade Wood and Gold that the two players value differently (SPIRAL training game).

Both players start with 10 Wood and 10 Gold; player 0 values Wood 5 / Gold 15, player 1 values
Wood 15 / Gold 5.  Player 0 moves first and the game ends after `max_turns` (10) valid actions:
the larger gain in inventory value wins (+1/-1), equal gains draw -- equivalently, player 0 wins
iff it ends with more than 20 items.  No randomness.

Actions, anywhere in the text (case-insensitive):

* `[Offer: 3 Wood -> 2 Gold]` offers items for items (lists split by `,` or ` and `, an optional
  leading `I give` / `I offer`, plural names, repeated names add up, quantities > 0).  Offering
  more than you hold, or an unreadable offer, is invalid.  A new offer replaces the open one; if
  the open one was made to you, it is implicitly denied.
* `[Accept]` / `[Deny]` answer the open offer; only its recipient may accept.  An accepted trade
  happens if both can pay; if only the proposer cannot, or neither can, it is cancelled; if only
  the acceptor cannot, the accept is invalid.
* Anything else is chat and leaves an open offer open.

As in the reference, an action is first checked as an answer to the open offer and then as a new
offer, and the game is decided when the last turn starts to be played, even by an invalid move.
"""
from __future__ import annotations

import re

from spiral_jax.envs.base import Env

RESOURCES = ("Wood", "Gold")
VALUES = ({"Wood": 5, "Gold": 15}, {"Wood": 15, "Gold": 5})
START = 10
PASS = "[Pass]"  # a canonical chat action, so a player can always move without trading

_ACCEPT = re.compile(r"\[Accept\]", re.IGNORECASE)
_DENY = re.compile(r"\[Deny\]", re.IGNORECASE)
_OFFER_START = re.compile(r"\[Offer:", re.IGNORECASE)
_LEAD = re.compile(r"^I\s+(?:give|offer)\s+", re.IGNORECASE)
_ITEM_SEP = re.compile(r",\s*|\s+and\s+", re.IGNORECASE)
_ITEM = re.compile(r"^(\d+)\s+(.+)$")
_PLURALS = {"Woods": "Wood", "Golds": "Gold"}

Items = tuple[tuple[str, int], ...]


def offer_body(action: str) -> str | None:
    """The inside of the first `[Offer: ...]` in `action` as the reference's pattern reads it, or None.

    That pattern (leading whitespace, an optional "I give"/"I offer", then the shortest body that
    leaves only spaces and dots before the "]") backtracks over a long run of spaces or dots with no
    "]" after it in time quadratic in the run's length. This reads the same body in linear time: the
    text after the whitespace and the optional words, up to the first "]", less its trailing dots and
    whitespace, and never empty.
    """
    for start in _OFFER_START.finditer(action):
        close = action.find("]", start.end())
        if close < 0:
            return None
        body = None if action.find("[", start.end(), close) >= 0 else _body(action[start.end():close])
        if body is not None:  # a bracket inside, or nothing at all, and the pattern looks further on
            return body
    return None


def _body(inside: str) -> str | None:
    """The pattern's body within one bracket, its backtracking written out (`offer_body`)."""
    rest = inside.lstrip()
    if not rest:  # whitespace alone: the pattern gives the body its last character
        return inside[-1:] or None
    lead = _LEAD.match(rest)
    if lead and lead.end() < len(rest):
        rest = rest[lead.end():]
    elif lead:  # only "I give" and whitespace: the words' last whitespace, if it can spare one, or the words
        words = rest[:lead.end()]
        if len(words) - len(words.rstrip()) >= 2:
            return words[-1]
    return rest.rstrip(".").rstrip() or rest[0]


def parse_offer(body: str) -> tuple[Items, Items] | None:
    """(offered, requested) from the inside of an `[Offer: ...]`, or None if it cannot be read.

    Trailing punctuation is stripped, not matched with a pattern like `[.,!?]+$`: that one scans
    each long run of punctuation from every position in it (time quadratic in its length).
    """
    body = " ".join(body.split()).rstrip(".,!?")
    parts = re.split(r"\s*->\s*", _LEAD.sub("", body))
    if len(parts) != 2:
        return None
    offered, requested = _parse_items(parts[0].strip()), _parse_items(parts[1].strip())
    return (offered, requested) if offered and requested else None


def _parse_items(text: str) -> Items | None:
    items: dict[str, int] = {}
    for item in _ITEM_SEP.split(text):
        item = item.strip()
        if not item:
            continue
        match = _ITEM.match(item)
        if match is None:
            return None
        try:
            quantity = int(match.group(1))
        except ValueError:  # more digits than Python parses
            return None
        name = match.group(2).strip().title()
        name = _PLURALS.get(name, name)
        if name not in RESOURCES or quantity <= 0:
            return None
        items[name] = items.get(name, 0) + quantity
    return tuple(items.items())


def _items_text(items: Items) -> str:
    return ", ".join(f"{q} {name}" for name, q in items)


class SimpleNegotiation(Env):
    """See the module docstring.  `max_turns` is the game length (10 valid actions).

    `legal_actions` (for strict trainer-side matching) lists `[Accept]` / `[Deny]` when an offer
    to the player is open (accept only if the player can pay), every one-for-one-resource offer
    `[Offer: a X -> b Y]` with 1 <= a <= min(offer_cap, held) and 1 <= b <= offer_cap, and
    `[Pass]`.  (The reference sampled three such offers plus chat lines at random each turn.)
    """

    turn_limit_is_draw = False

    def __init__(self, *, max_turns: int = 10, offer_cap: int = 3, **kwargs):
        if offer_cap < 1:
            raise ValueError("offer_cap must be >= 1")
        super().__init__(max_turns=max_turns, **kwargs)
        self.offer_cap = offer_cap

    def _setup(self) -> None:
        self._held = [{r: START for r in RESOURCES} for _ in (0, 1)]
        self._offer: dict | None = None
        self._history: list[dict] = []
        for p in (0, 1):
            own = tuple((r, self._held[p][r], VALUES[p][r]) for r in RESOURCES)
            self._tell("rules", (p, own), self._rules(p), to=p)

    def _legal(self) -> list[str]:
        p, offer, cap = self._player, self._offer, self.offer_cap
        actions = []
        if offer is not None and offer["to"] == p:
            if self._can_pay(p, offer["requested"]):
                actions.append("[Accept]")
            actions.append("[Deny]")
        for give in RESOURCES:
            for get in RESOURCES:
                if give != get:
                    actions += [f"[Offer: {a} {give} -> {b} {get}]"
                                for a in range(1, min(cap, self._held[p][give]) + 1) for b in range(1, cap + 1)]
        actions.append(PASS)
        return actions

    def _play(self, player: int, action: str) -> None:
        self._echo(player, action)
        self._answer_offer(player, action)
        if not self.done:
            self._new_offer(player, action)
        if not self.done and self.max_turns is not None and self.turn + 1 >= self.max_turns:
            self._decide()
        if not self.done and self._valid:
            self._advance(1 - player)

    def _answer_offer(self, player: int, action: str) -> None:
        offer = self._offer
        if offer is None:
            return
        if player != offer["to"]:
            if _ACCEPT.search(action):
                self._invalid(player, "accept_not_yours", "Only the player an offer was made to can accept it.")
            return
        if _ACCEPT.search(action):
            self._accept(player)
        elif _DENY.search(action):
            self._tell("deny", (player, offer["from"]), f"Player {player} turned down Player {offer['from']}'s offer.")
            self._close_offer("Denied")

    def _accept(self, player: int) -> None:
        offer = self._offer
        proposer = offer["from"]
        proposer_ok = self._can_pay(proposer, offer["offered"])
        acceptor_ok = self._can_pay(player, offer["requested"])
        if proposer_ok and acceptor_ok:
            for name, q in offer["offered"]:
                self._held[proposer][name] -= q
                self._held[player][name] += q
            for name, q in offer["requested"]:
                self._held[player][name] -= q
                self._held[proposer][name] += q
            self._tell("accept", (player, proposer),
                       f"Player {player} accepted Player {proposer}'s offer; the trade is done.")
            self._close_offer("Accepted")
        elif not acceptor_ok and proposer_ok:
            self._invalid(player, "accept_resources", "You do not have the items this trade asks of you.")
        else:
            who = "both" if not acceptor_ok else "proposer"
            why = "neither player can pay." if who == "both" else f"Player {proposer} no longer has the items."
            self._tell("cancelled", (who,), f"The trade is cancelled: {why}")
            self._offer = None

    def _new_offer(self, player: int, action: str) -> None:
        body = offer_body(action)
        if body is None:
            return
        parsed = parse_offer(body.strip())
        if parsed is None:
            self._invalid(player, "offer_format", "Write offers like [Offer: 3 Wood -> 2 Gold].")
            return
        offered, requested = parsed
        if not self._can_pay(player, offered):
            self._invalid(player, "offer_resources", "You cannot offer more than you hold.")
            return
        if self._offer is not None and self._offer["to"] == player:
            self._tell("implicit_deny", (player,),
                       f"Player {player} answered the open offer with a new one, turning it down.")
            self._close_offer("Implicitly Denied")
        self._offer = {"from": player, "to": 1 - player, "offered": offered, "requested": requested}
        self._tell("offer", (player, 1 - player, offered, requested), f"Player {player} offers Player {1 - player}: "
                   f"{_items_text(offered)} in exchange for {_items_text(requested)}.")

    def _close_offer(self, outcome: str) -> None:
        self._history.append({**self._offer, "outcome": outcome})
        self._offer = None

    def _can_pay(self, player: int, items: Items) -> bool:
        return all(self._held[player][name] >= q for name, q in items)

    def _gain(self, player: int) -> int:
        return sum((self._held[player][r] - START) * VALUES[player][r] for r in RESOURCES)

    def _decide(self) -> None:
        g0, g1 = self._gain(0), self._gain(1)
        if g0 == g1:
            self._draw(f"Both players gained {g0} in value.")
        else:
            winner = 0 if g0 > g1 else 1
            self._win(winner, f"Player {winner} gained more value ({max(g0, g1)} against {min(g0, g1)}).")

    def _rules(self, player: int) -> str:
        own = "; ".join(f"{self._held[player][r]} {r} worth {VALUES[player][r]} each" for r in RESOURCES)
        return (
            f"Negotiation game. You are Player {player}. You hold {own}. Your opponent holds the "
            "same items but may value them differently.\n"
            "Trade so that the value of your items grows more than your opponent's does. Each turn "
            "you may talk, or make an offer like [Offer: 3 Wood -> 2 Gold] (what you give -> what "
            "you want), or answer an offer made to you with [Accept] or [Deny]; text around these "
            "tokens is fine.\n"
        ) + (f"The game lasts {self.max_turns} turns in total." if self.max_turns else "There is no turn limit.")

    def _state(self) -> dict:
        return {"resources": [dict(h) for h in self._held], "offer": self._offer and dict(self._offer),
                "history": [dict(h) for h in self._history], "gains": [self._gain(0), self._gain(1)]}
