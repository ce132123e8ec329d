from engines.stopping import StopState


def _decode(ids: list[int]) -> str:
    return "".join(chr(i) for i in ids)


def _run(text: str, stop=(), max_tokens=100, eos=frozenset()):
    s = StopState(_decode, frozenset(eos), tuple(stop), max_tokens)
    out = "".join(s.push(ord(c)) for c in text)
    return out, s


def test_stop_string_truncates_and_holds_back_prefix():
    out, s = _run("hello world END tail", stop=["END"])
    assert out == "hello world " and s.finish_reason == "stop" and s.text == "hello world "


def test_partial_stop_prefix_released_when_not_a_stop():
    s = StopState(_decode, frozenset(), ("ENDX",), 100)
    assert s.push(ord("a")) == "a"
    assert s.push(ord("E")) == ""       # could be the start of ENDX
    assert s.push(ord("N")) == ""
    assert s.push(ord("o")) == "ENo"    # it was not


def test_max_tokens_and_eos():
    out, s = _run("abcdef", max_tokens=3)
    assert out == "abc" and s.finish_reason == "length"
    s = StopState(_decode, frozenset({0}), (), 10)
    assert s.push_many([ord("a"), 0, ord("b")]) == ("a", 2)
    assert s.finish_reason == "stop"


def test_stop_spanning_tokens_in_one_block():
    s = StopState(lambda ids: "".join(["ab", "c<", "/s", ">zz"][i] for i in ids), frozenset(), ("</s>",), 10)
    text, used = s.push_many([0, 1, 2, 3])
    assert text == "abc" and used == 4 and s.finish_reason == "stop"
