"""Tag schemes of token classification: what a sequence of word tags means.

| scheme  | tags                        | an entity of type T                                         |
|---------|-----------------------------|-------------------------------------------------------------|
| `IOB2`  | O, B-T, I-T                 | B-T, then I-T for each further word (BIO)                   |
| `IOB1`  | O, I-T, B-T                 | starts with I-T; B-T only separates two adjacent T entities |
| `IOBES` | O, B-T, I-T, E-T, S-T       | B-T I-T ... E-T, or S-T for a single word                   |
| `none`  | anything                    | none: plain labels such as part-of-speech tags              |

A bare prefix (`B`, `I`, `E`, `S`) is an entity of no type, which seqeval names `_`.

This module is the one home of the idea: the names (`SCHEMES`), parsing (`split_tag`),
detection (`detect_scheme`), validation (`check_tags`, `check_known_tags`), run_ner.py's
B-to-I map (`b_to_i_label_ids`), and the entities a tag sequence holds, in seqeval's two modes
(`lenient_entities`: conlleval's chunking, seqeval's default; `strict_entities`: seqeval's
`mode='strict'` with a scheme). `flaxheads.tasks.token.entity_metrics` counts those entities.

Messages count sentences and words from 1; `where(sentence, word)` callbacks (0-based
arguments) let a caller name a file and line instead.
"""

from __future__ import annotations

import collections

import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence

IOB1 = "IOB1"
IOB2 = "IOB2"
IOBES = "IOBES"
NO_SCHEME = "none"
SCHEMES = (IOB1, IOB2, IOBES, NO_SCHEME)
OUTSIDE = "O"

Where = Callable[[int, int | None], str]
"""(sentence, word), both 0-based, word None for the whole sentence -> how a message names it."""

_SCHEME_TAG = re.compile(r"([BIES])(?:-(.+))?", re.DOTALL)
_PREFIXES = {IOB1: "BI", IOB2: "BI", IOBES: "BIES"}

# Which tag may come before a tag (FOLLOWS) and after one (CONTINUES), of the same type: the
# transitions a well-formed sequence of each scheme allows. Sentence ends count as "O".
_FOLLOWS = {IOB2: {"I": "BI"}, IOB1: {"B": "BI"}, IOBES: {"I": "BI", "E": "BI"}}
_CONTINUES = {IOB2: {}, IOB1: {}, IOBES: {"B": "IE", "I": "IE"}}


def check_scheme(scheme: str) -> str:
    """`scheme` itself when it is one of `SCHEMES`; ValueError naming them otherwise."""
    if scheme not in SCHEMES:
        raise ValueError(f"unknown scheme={scheme!r}; choose one of {SCHEMES}")
    return scheme


def default_where(sentence: int, word: int | None = None) -> str:
    return f"sentence {sentence + 1}" + (f", word {word + 1}" if word is not None else "")


def split_tag(tag: str) -> tuple[str, str] | None:
    """("B", "PER") for "B-PER", ("O", "") for "O", ("B", "") for a bare "B"; None for a tag
    that belongs to no scheme (a POS tag, "B_PER", "L-PER")."""
    if tag == OUTSIDE:
        return OUTSIDE, ""
    match = _SCHEME_TAG.fullmatch(tag)
    return (match.group(1), match.group(2) or "") if match else None


def detect_scheme(sequences: Sequence[Sequence[str]], label_names: Iterable[str] = ()) -> tuple[str, str]:
    """(scheme, the reason, in words) read from the tags of `sequences` and `label_names`.

    Tags that are all O or prefix-type (B-PER) give IOBES when most entities end with an E- or
    S- tag (IOBES ends each with one); otherwise IOB1 when more entities start with I- than with
    B- (B- only after the same type), else IOB2. Most entities, not one: a stray S- among IOB2
    tags, or a B- start among IOB1's, is then refused where it is by `check_tags`, rather than
    taken as the scheme of every other sentence. Tags of which none is prefixed give `none`.
    Raises ValueError when typed scheme tags are mixed with others, naming the first odd tag and
    where it is.
    """
    names = sorted({tag for sequence in sequences for tag in sequence} | set(label_names))
    parts = {name: split_tag(name) for name in names}
    odd = [name for name, part in parts.items() if part is None]
    typed = [name for name, part in parts.items() if part is not None and part[1]]
    if odd and not typed:
        return NO_SCHEME, f"the tags ({_some(names)}) have no B-/I-/E-/S- prefixes: plain labels"
    if odd:
        sentence, word = _first_position(sequences, odd[0])
        place = f" ({default_where(sentence, word)})" if sentence is not None else ""
        raise ValueError(
            f"the tags mix scheme tags ({_some(typed)}) with others: {odd[0]!r}{place} is neither O nor "
            f"<B|I|E|S>-<type>. Fix that tag, or pass scheme={NO_SCHEME!r} to read every tag as a plain "
            "label (entity metrics then do not apply)"
        )
    prefixes = {part[0] for part in parts.values()}
    if prefixes == {OUTSIDE}:
        return IOB2, "only O tags: nothing tells the scheme, IOB2 assumed"
    starts_with_b, starts_with_i = _entity_starts(sequences)
    ends = collections.Counter(split_tag(tag)[0] for sequence in sequences for tag in sequence if split_tag(tag))
    entities = starts_with_b + starts_with_i + ends["S"]
    if not entities and prefixes & {"E", "S"}:
        return IOBES, "E- or S- tags are among the label names"  # no entity in the tags to count
    if 2 * (ends["E"] + ends["S"]) > entities:
        return IOBES, f"most entities end with an E- or S- tag ({ends['E'] + ends['S']} of them)"
    if starts_with_i > starts_with_b:
        b_starts = f", B- {starts_with_b}" if starts_with_b else ""
        return IOB1, f"entities start with I- ({starts_with_i} times{b_starts}) and B- only follows its own type"
    return IOB2, "B- and I- tags, entities start with B-"


def _entity_starts(sequences: Sequence[Sequence[str]]) -> tuple[int, int]:
    """How many B-T and how many I-T tags follow neither B-T nor I-T: the two ways an entity starts."""
    with_b = with_i = 0
    for sequence in sequences:
        previous = (OUTSIDE, "")
        for tag in sequence:
            prefix, kind = split_tag(tag)
            if prefix in "BI" and not (previous[0] in "BI" and previous[1] == kind):
                with_b += prefix == "B"
                with_i += prefix == "I"
            previous = (prefix, kind)
    return with_b, with_i


def _first_position(sequences: Sequence[Sequence[str]], tag: str) -> tuple[int | None, int | None]:
    for sentence, sequence in enumerate(sequences):
        for word, candidate in enumerate(sequence):
            if candidate == tag:
                return sentence, word
    return None, None


def _some(names: Sequence[str], limit: int = 6) -> str:
    shown = ", ".join(repr(n) for n in list(names)[:limit])
    return shown + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def check_tags(sequences: Sequence[Sequence[str]], scheme: str, *, where: Where = default_where) -> None:
    """Raises ValueError at the first tag that `scheme` does not allow where it stands: a tag that
    is not O or <prefix>-<type> of the scheme, an IOB2 I-T that continues no entity, an IOB1 B-T
    after anything but T, an IOBES I-T/E-T that continues nothing or a B-T/I-T that is never
    closed. The message names the word (`where`), the tags around it and the fix. Any tag passes
    under `none`; an empty tag fails under every scheme."""
    check_scheme(scheme)
    for sentence, sequence in enumerate(sequences):
        for word, tag in enumerate(sequence):
            if not isinstance(tag, str) or not tag:
                raise ValueError(f"{where(sentence, word)}: the tag is empty ({tag!r}); give every word a tag")
        if scheme != NO_SCHEME:
            _check_sequence(sequence, scheme, lambda word, s=sentence: where(s, word))


def _check_sequence(sequence: Sequence[str], scheme: str, where: Callable[[int], str]) -> None:
    parts = []
    for word, tag in enumerate(sequence):
        part = split_tag(tag)
        if part is None or (part[0] != OUTSIDE and part[0] not in _PREFIXES[scheme]):
            allowed = "/".join(f"{p}-" for p in _PREFIXES[scheme])
            raise ValueError(
                f"{where(word)}: the tag {tag!r} is not O nor {allowed}<type> ({scheme}). Fix the tag, pass the "
                f"scheme the data is in (one of {SCHEMES[:3]}), or scheme={NO_SCHEME!r} for plain labels"
            )
        parts.append(part)
    padded = [(OUTSIDE, ""), *parts, (OUTSIDE, "")]
    for index in range(1, len(padded)):
        (before, before_type), (prefix, kind) = padded[index - 1], padded[index]
        word = index - 1
        if prefix in _FOLLOWS[scheme] and not (before in _FOLLOWS[scheme][prefix] and before_type == kind):
            raise ValueError(_continues_nothing(scheme, sequence, word, where))
        if before in _CONTINUES[scheme] and not (prefix in _CONTINUES[scheme][before] and before_type == kind):
            raise ValueError(_not_closed(sequence, word - 1, where))


def _continues_nothing(scheme: str, sequence: Sequence[str], word: int, where: Callable[[int], str]) -> str:
    tag = sequence[word]
    _, kind = split_tag(tag)
    before = f"the tag before it is {sequence[word - 1]!r}" if word else "it starts the sentence"
    named = f"-{kind}" if kind else ""
    if scheme == IOB2:
        return (
            f"{where(word)}: {tag!r} continues no entity ({before}). Under IOB2 an entity starts with "
            f"B{named}: change the tag to B{named}, or pass scheme={IOB1!r} if the data starts entities with "
            "I- (IOB1, as the original CoNLL-2003 files)"
        )
    if scheme == IOB1:
        return (
            f"{where(word)}: {tag!r} follows no {kind or 'untyped'} entity ({before}). Under IOB1 an entity "
            f"starts with I{named} and B{named} only separates two adjacent ones: change the tag to I{named}, or "
            f"pass scheme={IOB2!r} if the data starts every entity with B-"
        )
    return (
        f"{where(word)}: {tag!r} continues no entity ({before}). Under IOBES an entity of several words is "
        f"B{named} I{named} ... E{named} and one of a single word is S{named}"
    )


def _not_closed(sequence: Sequence[str], word: int, where: Callable[[int], str]) -> str:
    tag = sequence[word]
    _, kind = split_tag(tag)
    named = f"-{kind}" if kind else ""
    after = f"the next tag is {sequence[word + 1]!r}" if word + 1 < len(sequence) else "the sentence ends"
    return (
        f"{where(word)}: {tag!r} opens an entity that is never closed ({after}). Under IOBES an entity of "
        f"several words ends with E{named}, and one of a single word is S{named}"
    )


def check_known_tags(
    sequences: Sequence[Sequence[str]], label_names: Sequence[str], *, where: Where = default_where,
    split: str = "this split",
) -> None:
    """Raises ValueError at the first tag that is not among `label_names` (the tags the model
    trains on), naming the word and the known tags."""
    known = set(label_names)
    for sentence, sequence in enumerate(sequences):
        for word, tag in enumerate(sequence):
            if tag not in known:
                raise ValueError(
                    f"{where(sentence, word)}: the tag {tag!r} of {split} is not among the training tags "
                    f"({_some(sorted(known), 12)}). A model cannot predict a tag it never trained on: add "
                    "training sentences with it, map it to a known tag, or give label_names that include it"
                )


def b_to_i_label_ids(label_names: Sequence[str]) -> list[int]:
    """For each label id, the id its word's later subwords get with `label_all_tokens`: the id of
    I-X for B-X when I-X is a label, its own id otherwise (transformers' run_ner.py `b_to_i_label`,
    `str.replace` included)."""
    names = list(label_names)
    return [
        names.index(name.replace("B-", "I-")) if name.startswith("B-") and name.replace("B-", "I-") in names else i
        for i, name in enumerate(names)
    ]


# ---------------------------------------------------------------------------------------------
# Entities, as seqeval 1.2.2 finds them.


def lenient_entities(
    sequences: Sequence[Sequence[str]], *, where: Where = default_where
) -> dict[str, set[tuple[int, int]]]:
    """Type -> {(start, end)} of the entities conlleval's chunking finds (seqeval's default mode,
    `get_entities`): the sentences are laid end to end with an O after each, and (start, end) are
    inclusive offsets into that sequence. Any tag reads as prefix (its first character) and
    type (the text after its first hyphen, `_` if none), as seqeval reads it, malformed sequences
    included: an I-T after O starts an entity, a change of type ends one. Raises ValueError
    naming the word of an empty tag, which has no prefix to read."""
    for sentence, sequence in enumerate(sequences):
        for word, tag in enumerate(sequence):
            if not isinstance(tag, str) or not tag:
                raise ValueError(f"{where(sentence, word)}: the tag is empty ({tag!r}); give every word a tag")
    entities: dict[str, set[tuple[int, int]]] = defaultdict(set)
    previous_prefix, previous_type, begin = OUTSIDE, "", 0
    flat = [tag for sequence in sequences for tag in [*sequence, OUTSIDE]]
    for offset, tag in enumerate([*flat, OUTSIDE]):
        prefix = tag[0]
        kind = tag[1:].split("-", maxsplit=1)[-1] or "_"
        if _lenient_end(previous_prefix, prefix, previous_type, kind):
            entities[previous_type].add((begin, offset - 1))
        if _lenient_start(previous_prefix, prefix, previous_type, kind):
            begin = offset
        previous_prefix, previous_type = prefix, kind
    return dict(entities)


def _lenient_end(previous: str, prefix: str, previous_type: str, kind: str) -> bool:
    """seqeval's `end_of_chunk`: an entity ended between the previous word and this one."""
    return (
        previous in "ES"
        or (previous in "BI" and prefix in "BSO")
        or (previous not in (OUTSIDE, ".") and previous_type != kind)
    )


def _lenient_start(previous: str, prefix: str, previous_type: str, kind: str) -> bool:
    """seqeval's `start_of_chunk`: an entity starts at this word."""
    return (
        prefix in "BS"
        or (previous in "ES" and prefix in "EI")
        or (previous == OUTSIDE and prefix in "EI")
        or (prefix not in (OUTSIDE, ".") and previous_type != kind)
    )


_SAME, _DIFF, _ANY = "same", "diff", "any"
_ALL = "IOBESUL"
# seqeval's `scheme.py` pattern sets, row for row: (previous prefixes, current prefixes, type).
_STRICT = {
    IOB1: {
        "allowed": "IOB",
        "start": [("O", "I", _ANY), ("I", "I", _DIFF), ("B", "I", _ANY), ("I", "B", _SAME), ("B", "B", _SAME)],
        "inside": [("B", "I", _SAME), ("I", "I", _SAME)],
        "end": [("I", "I", _DIFF), ("I", "O", _ANY), ("I", "B", _ANY), ("B", "O", _ANY), ("B", "I", _DIFF),
                ("B", "B", _SAME)],
    },
    IOB2: {
        "allowed": "IOB",
        "start": [(_ALL, "B", _ANY)],
        "inside": [("B", "I", _SAME), ("I", "I", _SAME)],
        "end": [("I", "O", _ANY), ("I", "I", _DIFF), ("I", "B", _ANY), ("B", "O", _ANY), ("B", "I", _DIFF),
                ("B", "B", _ANY)],
    },
    IOBES: {
        "allowed": "IOBES",
        "start": [(_ALL, "B", _ANY), (_ALL, "S", _ANY)],
        "inside": [("B", "I", _SAME), ("B", "E", _SAME), ("I", "I", _SAME), ("I", "E", _SAME)],
        "end": [("S", _ALL, _ANY), ("E", _ALL, _ANY)],
    },
}


def _matches(patterns, previous: tuple[str, str], current: tuple[str, str]) -> bool:
    for previous_prefixes, current_prefixes, kind in patterns:
        if previous[0] in previous_prefixes and current[0] in current_prefixes and (
            kind == _ANY or (kind == _SAME) == (previous[1] == current[1])
        ):
            return True
    return False


def strict_entities(
    sequences: Sequence[Sequence[str]], scheme: str, *, where: Where = default_where
) -> set[tuple[int, str, int, int]]:
    """{(sentence, type, start, end)} of the entities seqeval's `mode='strict'` finds under
    `scheme` (IOB1, IOB2 or IOBES; `end` exclusive): only complete, well-formed entities count.
    Raises ValueError naming the word of the first tag whose prefix the scheme does not have."""
    if scheme not in _STRICT:
        raise ValueError(f"strict entities need scheme one of {tuple(_STRICT)}, not {scheme!r}")
    table = _STRICT[scheme]
    found = set()
    for sentence, sequence in enumerate(sequences):
        tokens = []
        for word, tag in enumerate(sequence):
            if not tag or tag[0] not in table["allowed"]:
                raise ValueError(
                    f"{where(sentence, word)}: the tag {tag!r} has a prefix {scheme} does not use (its prefixes: "
                    f"{'/'.join(table['allowed'])}); pass the scheme the tags are written in"
                )
            tokens.append((tag[0], tag[1:].strip("-") or "_"))
        found.update((sentence, kind, start, end) for kind, start, end in _strict_spans(tokens, table))
    return found


def _strict_spans(tokens: list[tuple[str, str]], table) -> list[tuple[str, int, int]]:
    """seqeval's `Tokens.entities`: (type, start, exclusive end) of each entity of one sentence."""
    extended = [*tokens, (OUTSIDE, "_")]
    spans, index, previous = [], 0, (OUTSIDE, "_")
    while index < len(extended):
        token = extended[index]
        if _matches(table["start"], previous, token):
            end = index + 1
            inside = token
            while end < len(extended) and _matches(table["inside"], inside, extended[end]):
                inside = extended[end]
                end += 1
            if _matches(table["end"], extended[end - 1], extended[end]):
                spans.append((token[1], index, end))
            index = end
        else:
            index += 1
        previous = extended[index - 1]
    return spans


__all__ = [
    "IOB1",
    "IOB2",
    "IOBES",
    "NO_SCHEME",
    "OUTSIDE",
    "SCHEMES",
    "b_to_i_label_ids",
    "check_known_tags",
    "check_scheme",
    "check_tags",
    "detect_scheme",
    "lenient_entities",
    "split_tag",
    "strict_entities",
]
