"""Reading the reference traces (../shared/conformance/ta_traces): chance events, states and facts.

The reference's messages are TextArena's wording; ours differ.  What must agree is the facts: this
module turns each reference message into (sender, kind, data) facts, the same tuples our envs put
in `Message.sender/kind/data`, and maps reference states onto `Env.state()`.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

TRACE_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "conformance" / "ta_traces"
CARD = {"J": 0, "Q": 1, "K": 2}
REPLAYED: dict[str, tuple[int, int]] = {}  # env id -> (games, steps) replayed, for the summary

# Trace files of games that are not native here, and why.
NOT_NATIVE = {
    "KuhnPoker-v0": "TextArena 0.6.4's own Kuhn (10 rounds, broken winner check): not a SPIRAL game",
    "SimpleNegotiation-v0": "TextArena 0.6.4's own negotiation (random values): superseded by -v1",
    "TruthAndDeception-v1": "needs TextArena's fact list: available through the TextArena adapter",
}


def load(env_id: str) -> list[dict]:
    path = TRACE_DIR / f"{env_id}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(
            f"reference trace {path} is missing: the conformance data lives in the 'shared/' folder "
            "next to the repository (CI provides it)")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"-?\d+", text))


# ---- facts ------------------------------------------------------------------------------------

def _reason_code(reason: str, codes: list[tuple[str, str]]) -> str:
    for needle, code in codes:
        if needle in reason:
            return code
    raise AssertionError(f"unmapped reference reason: {reason!r}")


def _ttt_board(text):
    grid, moves = text.split("Available Moves:")
    rows = grid.split("Current Board:")[1].strip("\n").split("\n---+---+---\n")
    cells = tuple("" if c.strip().isdigit() else c.strip() for row in rows for c in row.split("|"))
    return [("board", (cells, _ints(moves)))]


def _tak_board(text):
    grid, moves = text.split("Available Moves:")
    cells = tuple("" if c.strip().isdigit() else c.strip()
                  for line in grid.splitlines() if line.startswith("|") for c in line.strip("|").split("|"))
    return [("board", (cells, _ints(moves)))]


def _c4_rows(text):
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("---")) + 1
    return tuple("".join(line.split()) for line in lines[start:] if line.strip())


def _piles(text):
    return tuple(int(n) for n in re.findall(r"pile \d+: (\d+)", text))


def _kuhn_round(text):
    r, n = _ints(text.split("\n")[0])
    facts = [("round", (r, n, CARD[re.search(r"Your card is: (\w)", text).group(1)]))]
    if "available actions" in text:
        facts.append(("actions", tuple(re.findall(r"\[\w+\]", text.split("available actions are:")[1]))))
    return facts


def _offer_items(text):
    return tuple((name, int(q)) for q, name in re.findall(r"(\d+) (\w+)", text))


def _negotiation_offer(m):
    return [("offer", (int(m[1]), int(m[2]), _offer_items(m[3]), _offer_items(m[4])))]


def _liars_dice(text):
    dice_text, counts = text.split("Remaining dice:")
    return [("dice", (_ints(dice_text), tuple(int(n) for n in re.findall(r"Player \d+: (\d+)", counts))))]


# Per env: (regex, facts builder) for game messages, and (substring -> code) for invalid reasons.
GAME_MESSAGES = {
    "TicTacToe-v0": [
        (r"You are Player (\d) in Tic Tac Toe", lambda m: [("rules", (int(m[1]),))]),
        (r"^Current Board:", lambda m: _ttt_board(m.string)),
    ],
    "SimpleTak-v0": [
        (r"You are Player (\d) in SimpleTak", lambda m: [("rules", (int(m[1]),))]),
        (r"^Current Board:", lambda m: _tak_board(m.string)),
    ],
    "ConnectFour-v0": [
        (r"You are Player (\d) in Connect Four", lambda m: [("rules", (int(m[1]), _c4_rows(m.string)))]),
        (r"^Board state:", lambda m: [("board", (_c4_rows(m.string),))]),
    ],
    "Nim-v0": [
        (r"Welcome to Nim, Player (\d)", lambda m: [("rules", (int(m[1]), _piles(m.string)))]),
        (r"^Player (\d) removes (\d+) from pile (\d+)\.$", lambda m: [("remove", _ints(m[0]))]),
        (r"^Updated piles:", lambda m: [("piles", (_piles(m.string),))]),
    ],
    "KuhnPoker-v1": [
        (r"You are Player (\d) in a \d+ round game of Kuhn Poker", lambda m: [("rules", (int(m[1]),))]),
        (r"^Starting round", lambda m: _kuhn_round(m.string)),
        (r"^Your available actions are: (.*)$", lambda m: [("actions", tuple(re.findall(r"\[\w+\]", m[1])))]),
        (r"^Cards: Player 0 had (\w), Player 1 had (\w)$", lambda m: [("showdown", (CARD[m[1]], CARD[m[2]]))]),
        (r"^Showdown: Player (\d)'s \w beats .* wins pot of (\d+) chips\.$",
         lambda m: [("round_won", (int(m[1]), int(m[2])))]),
        (r"^Player (\d) has folded\.$", lambda m: [("fold", (int(m[1]),))]),
    ],
    "PigDice-v1": [
        (r"You are Player (\d)\.[\s\S]*First to (\d+) points", lambda m: [("rules", (int(m[1]), int(m[2])))]),
        (r"^(?:Game starting! Player (\d) goes first|Player (\d)'s turn)[\s\S]*Player 0 score: (\d+)\nPlayer 1 score: (\d+)",
         lambda m: [("turn", (int(m[1] or m[2]), int(m[3]), int(m[4])))]),
        (r"^Available actions: '\[roll\]' or '\[hold\]'$", lambda m: [("actions", ("[roll]", "[hold]"))]),
        (r"^Player (\d) rolls a (\d)\.$", lambda m: [("roll", (int(m[1]), int(m[2])))]),
        (r"^Turn total is now (\d+)\.$", lambda m: [("turn_total", (int(m[1]),))]),
        (r"^Player (\d) busted!", lambda m: [("bust", (int(m[1]),))]),
        (r"^Player (\d) holds and banks (\d+) points\. Total score: (\d+)$", lambda m: [("hold", _ints(m[0]))]),
    ],
    "LiarsDice-v1": [
        (r"You are Player (\d) in an N-player Liar's Dice game\.\nYou have \d+ dice: ([\d, ]+)\.\nPlayer \d has (\d+) dice\.",
         lambda m: [("rules", (int(m[1]), _ints(m[2]), int(m[3])))]),
        (r"^Player (\d) bids (\d+) of face (\d)\.$", lambda m: [("bid", _ints(m[0]))]),
        (r"^Current bid: (\d+) of face (\d)\nYour turn", lambda m: [("turn", (int(m[1]), int(m[2])))]),
        (r"^Player (\d) calls! The actual count of face (\d) is (\d+), which is .*?(\d+)\.\nPlayer (\d) ",
         lambda m: [("call", (int(m[1]), int(m[2]), int(m[3]), int(m[4]), int(m[5])))]),
        (r"^Your new dice are:", lambda m: _liars_dice(m.string)),
        (r"^Player (\d) starts the new round\.$", lambda m: [("round_start", (int(m[1]),))]),
        (r"^Player (\d) is eliminated!$", lambda m: [("eliminated", (int(m[1]),))]),
    ],
    "Snake-v0": [
        (r"You control snake (\d)\.", lambda m: [("rules", (int(m[1]),))]),
        (r"^Board after simultaneous moves:", lambda m: [("board", (tuple(
            "".join(line[1:-1].split()) for line in m.string.splitlines()[2:-1]),))]),
    ],
    "SimpleNegotiation-v1": [
        (r"You are Player (\d) in the Negotiation Game", lambda m: [("rules", (int(m[1]), tuple(
            (name, int(q), int(v)) for name, q, v in re.findall(r"\[(\w+)\]\s+Qty: (\d+)\s+Value: (\d+)", m.string))))]),
        (r"^Player (\d) made the following offer to Player (\d): Offered items: (.*) -> Requested items: (.*)$",
         _negotiation_offer),
        (r"^Player (\d) implicitly denied", lambda m: [("implicit_deny", (int(m[1]),))]),
        (r"^Player (\d) denied the trade offer from Player (\d)\.$", lambda m: [("deny", _ints(m[0]))]),
        (r"^Player (\d) accepted the trade offer from Player (\d)\.$", lambda m: [("accept", _ints(m[0]))]),
        (r"^Trade cancelled: Neither", lambda m: [("cancelled", ("both",))]),
        (r"^Trade cancelled: Player", lambda m: [("cancelled", ("proposer",))]),
    ],
}

REASONS = {
    "TicTacToe-v0": [("Invalid move format", "format"), ("Invalid cell number", "range"),
                     ("already occupied", "occupied")],
    "SimpleTak-v0": [("Invalid move format", "format"), ("Invalid cell number", "range"),
                     ("already occupied", "occupied")],
    "ConnectFour-v0": [("Invalid action format", "format"), ("out of bounds", "out_of_bounds"),
                       ("is full", "full")],
    "Nim-v0": [("No valid move format", "format"), ("out of range", "pile_range"),
               ("at least 1", "zero"), ("Cannot remove", "too_many")],
    "KuhnPoker-v1": [("[Check], [Bet], [Call], or [Fold]", "format"), ("Action must be", "illegal")],
    "PigDice-v1": [("Invalid action format", "format")],
    "LiarsDice-v1": [("no prior bid", "no_bid"), ("not recognized", "format"),
                     ("Quantity must be positive", "bad_quantity"), ("Face value must be", "bad_face"),
                     ("is lower than current", "lower_quantity"), ("With same quantity", "lower_face"),
                     ("identical", "same_bid"), ("exceeds total dice", "too_many")],
    "Snake-v0": [("Invalid move format", "format")],
    "SimpleNegotiation-v1": [("not made to them", "accept_not_yours"), ("tried accepting", "accept_resources"),
                             ("incorrect format", "offer_format"), ("necessary resources", "offer_resources")],
}


def reference_facts(env_id: str, messages: list) -> list[tuple]:
    """(sender, kind, data) facts told by a list of reference [sender, text] messages."""
    facts = []
    for sender, text in messages:
        if sender >= 0:
            facts.append((sender, "action", (text,)))
            continue
        m = re.match(r"Player (\d) attempted an invalid move\. Reason: (.*) Please resubmit", text, re.S)
        if m:
            facts.append((-1, "invalid", (int(m[1]), _reason_code(m[2], REASONS[env_id]))))
            continue
        m = re.match(r"Player (\d) lost the game by way of invalid move\. Reason: (.*)", text, re.S)
        if m:
            facts.append((-1, "forfeit", (int(m[1]), _reason_code(m[2], REASONS[env_id]))))
            continue
        m = re.match(r"Player (\d) won the game\.", text)
        if m:
            facts.append((-1, "win", (int(m[1]),)))
            continue
        if text.startswith("The game ended in a draw."):
            facts.append((-1, "draw", ()))
            continue
        for pattern, build in GAME_MESSAGES[env_id]:
            m = re.search(pattern, text, re.M)
            if m:
                facts += [(-1, kind, data) for kind, data in build(m)]
                break
        else:
            raise AssertionError(f"{env_id}: unmapped reference message {text!r}")
    return facts


def our_facts(messages: list) -> list[tuple]:
    return [(m.sender, m.kind, m.data) for m in messages]


# ---- chance events ----------------------------------------------------------------------------

def invalid_steps(game: dict) -> list[bool]:
    """Whether the reference refused each step's action (error count up, or lost by invalid move)."""
    flags, prev = [], game["initial_state"]["error_count"]
    for step in game["steps"]:
        state = step["state"]
        forfeit = step["done"] and step["info"].get("reason", "").startswith("Invalid Move")
        flags.append(forfeit or (not step["done"] and state["error_count"] == prev + 1))
        prev = state["error_count"]
    return flags


def chance(env_id: str, game: dict) -> dict:
    """The chance outcomes the reference drew, in order, for `Env.reset(chance=...)`."""
    init, steps = game["initial_state"], game["steps"]
    if env_id == "KuhnPoker-v1":
        deals = [init["game_state"]["player_cards"]] + [
            s["game_state_before"]["player_cards"] for s in steps if s["game_state_before"]]
        return {"deal": [(d["0"], d["1"]) for d in deals]}
    if env_id == "PigDice-v1":
        return {"roll": [s["state"]["env_roll_value"] for s, bad in zip(steps, invalid_steps(game))
                         if not bad and s["state"]["env_roll_value"] is not None]}
    if env_id == "LiarsDice-v1":
        rolls, prev = [], None
        for state in [init] + [s["state"] for s in steps]:
            dice = state["game_state"]["dice_rolls"]
            if dice != prev and not state["done"]:
                rolls.append(tuple(tuple(dice[k]) for k in sorted(dice)))
            prev = dice
        return {"dice": rolls}
    if env_id == "Snake-v0":
        gs = init["game_state"]
        cells = [gs["snakes"][k]["positions"][0] for k in ("0", "1")] + gs["apples"]
        prev = gs["apples"]
        for s in steps:
            apples = s["state"]["game_state"]["apples"]
            cells += [a for a in apples if a not in prev]
            prev = apples
        return {"cell": [tuple(c) for c in cells]}
    return {}


# ---- states -----------------------------------------------------------------------------------

def reference_state(env_id: str, state: dict, game_state: dict | None = None) -> dict:
    """A reference state in the shape of `Env.state()` (the fields both sides have)."""
    gs = state["game_state"] if game_state is None else game_state
    rewards = state["rewards"]
    out = {"turn": state["turn"], "error_count": state["error_count"], "done": state["done"],
           "rewards": None if rewards is None else {int(k): v for k, v in rewards.items()}}
    two = lambda d: [d["0"], d["1"]]  # noqa: E731
    if env_id in ("TicTacToe-v0", "SimpleTak-v0", "ConnectFour-v0"):
        out["board"] = gs["board"]
    elif env_id == "Nim-v0":
        out["piles"] = gs["piles"]
    elif env_id == "KuhnPoker-v1":
        out.update(round=gs["current_round"], cards=two(gs["player_cards"]), chips=two(gs["player_chips"]),
                   pot=gs["pot"], opener=gs["starting_player"])
        tree = gs["current_legal_action_tree"]
        live = isinstance(tree, dict) and not state["done"]
        out["moves"] = sorted(f"[{k}]" for k in tree) if live else []  # the trace sorted the keys
    elif env_id == "PigDice-v1":
        out.update(scores=gs["scores"], turn_total=gs["turn_total"], turn_count=gs["turn_count"])
    elif env_id == "LiarsDice-v1":
        out.update(dice=two(gs["dice_rolls"]), remaining=two(gs["remaining_dice"]),
                   bid=[gs["current_bid"]["quantity"], gs["current_bid"]["face_value"]],
                   last_bidder=gs["last_bidder_id"])
    elif env_id == "Snake-v0":
        snakes = two(gs["snakes"])
        out.update(snakes=[s["positions"] for s in snakes], alive=[s["alive"] for s in snakes],
                   apples=gs["apples"], scores=two(gs["scores"]),
                   death_turn={int(k): v for k, v in gs["death_turn"].items()},
                   pending=[a is not None for a in two(state["env_pending_actions"])])
    elif env_id == "SimpleNegotiation-v1":
        offer = gs["current_offer"]
        out.update(resources=two(gs["player_resources"]),
                   offer=None if offer is None else _offer(offer),
                   history=[{**_offer(h), "outcome": h["outcome"]} for h in gs["trade_history"]],
                   gains=[gs["inventory_value"][k]["change"] for k in ("0", "1")])
    return out


def _offer(o: dict) -> dict:
    return {"from": o["from_player"], "to": o["to_player"], "offered": dict(o["offered_resources"]),
            "requested": dict(o["requested_resources"])}


def our_state(env_id: str, env) -> dict:
    """`env.state()` reduced to the fields `reference_state` produces."""
    state = env.state()
    out = {k: state[k] for k in ("turn", "error_count", "done", "rewards")}
    if env_id == "KuhnPoker-v1":
        out.update({k: state[k] for k in ("round", "cards", "chips", "pot", "opener")})
        out["moves"] = sorted(env.legal_actions())
    elif env_id == "SimpleNegotiation-v1":
        norm = lambda o: {**o, "offered": dict(o["offered"]), "requested": dict(o["requested"])}  # noqa: E731
        out.update(resources=state["resources"], gains=state["gains"],
                   offer=None if state["offer"] is None else norm(state["offer"]),
                   history=[norm(h) for h in state["history"]])
    else:
        out.update({k: v for k, v in state.items() if k not in out and k not in ("current_player",)})
    return out
