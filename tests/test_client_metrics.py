"""CLIENT_METRICS config resources behave as Apache Kafka 4.x answers (Incremental)AlterConfigs and DescribeConfigs."""

from __future__ import annotations

import json

import pytest

from kcm_common.client_metrics import (
    OP_APPEND,
    OP_DELETE,
    OP_SET,
    OP_SUBTRACT,
    ConfigError,
    Subscription,
)
from kcm_common.codes import (
    CLIENT_METRICS_CONFIG_SOURCE,
    DEFAULT_CONFIG_SOURCE,
    INVALID_CONFIG,
    INVALID_REQUEST,
)
from kcm_common.java import PatternError, compile_pattern, copy_capacity, hash_order, split
from kcm_sandbox.store import StateFileError, SubscriptionStore


def _set(**configs: str) -> list[tuple[str, int, str | None]]:
    return [(name.replace("_", "."), OP_SET, value) for name, value in configs.items()]


def _values(store: SubscriptionStore, name: str) -> dict[str, tuple[str | None, int]]:
    return {entry.name: (entry.value, entry.source) for entry in store.describe(name)}


def _refused(change) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        change()
    return caught.value


# --- validation: every error code and message Kafka answers -------------------------------------------------


@pytest.mark.parametrize(
    ("ops", "code", "message"),
    [
        ([("foo", OP_SET, "1")], INVALID_REQUEST, "Unknown client metrics configuration: foo"),
        ([("interval.ms", OP_SET, "99")], INVALID_REQUEST,
         "Invalid value 99 for interval.ms, interval must be between 100 and 3600000 (1 hour)"),
        ([("interval.ms", OP_SET, "3600001")], INVALID_REQUEST,
         "Invalid value 3600001 for interval.ms, interval must be between 100 and 3600000 (1 hour)"),
        ([("interval.ms", OP_SET, "1e3")], INVALID_CONFIG,
         "Invalid value 1e3 for configuration interval.ms: Not a number of type INT"),
        ([("interval.ms", OP_SET, "4294967296")], INVALID_CONFIG,
         "Invalid value 4294967296 for configuration interval.ms: Not a number of type INT"),
        # Integer.parseInt's edges: past them not an INT (40), within them an INT out of range (42).
        ([("interval.ms", OP_SET, "2147483648")], INVALID_CONFIG,
         "Invalid value 2147483648 for configuration interval.ms: Not a number of type INT"),
        ([("interval.ms", OP_SET, "-2147483649")], INVALID_CONFIG,
         "Invalid value -2147483649 for configuration interval.ms: Not a number of type INT"),
        ([("interval.ms", OP_SET, "2147483647")], INVALID_REQUEST,
         "Invalid value 2147483647 for interval.ms, interval must be between 100 and 3600000 (1 hour)"),
        ([("interval.ms", OP_SET, "1000000000")], INVALID_REQUEST,
         "Invalid value 1000000000 for interval.ms, interval must be between 100 and 3600000 (1 hour)"),
        # Python converts no more than 4300 digits: 5000 raised ValueError and dropped the sandbox's connection.
        ([("interval.ms", OP_SET, "9" * 5000)], INVALID_CONFIG,
         f"Invalid value {'9' * 5000} for configuration interval.ms: Not a number of type INT"),
        # Integer.parseInt reads a digit of any script one UTF-16 unit long; a supplementary one (two units) is none.
        ([("interval.ms", OP_SET, "\U0001d7cf\U0001d7ce\U0001d7ce")], INVALID_CONFIG,
         "Invalid value \U0001d7cf\U0001d7ce\U0001d7ce for configuration interval.ms: Not a number of type INT"),
        ([("interval.ms", OP_SET, "\u0669\u0669")], INVALID_REQUEST,
         "Invalid value 99 for interval.ms, interval must be between 100 and 3600000 (1 hour)"),
        ([("interval.ms", OP_SET, "+")], INVALID_CONFIG,
         "Invalid value + for configuration interval.ms: Not a number of type INT"),
        ([("interval.ms", OP_SET, "+-5")], INVALID_CONFIG,
         "Invalid value +-5 for configuration interval.ms: Not a number of type INT"),
        # KAFKA-18907: a value set or changed longer than Short.MAX_VALUE Java characters, before any other check.
        ([("metrics", OP_SET, "m" * 32768), ("foo", OP_SET, "1")], INVALID_CONFIG,
         "The configuration value cannot be added because it exceeds the maximum value size of 32767 bytes."),
        ([("metrics", OP_SET, "\U0001f600" * 16384)], INVALID_CONFIG,   # two UTF-16 units each: 32768
         "The configuration value cannot be added because it exceeds the maximum value size of 32767 bytes."),
        ([("match", OP_SET, "client_name=x")], INVALID_CONFIG, "Illegal client matching pattern: client_name=x"),
        ([("match", OP_SET, "client_id=[")], INVALID_CONFIG, "Illegal client matching pattern: client_id=["),
        ([("match", OP_SET, "client_id")], INVALID_CONFIG, "Illegal client matching pattern: client_id"),
        ([("match", OP_SET, "client_id=")], INVALID_CONFIG, "Illegal client matching pattern: client_id="),
        ([("match", OP_SET, "client_id=a=b")], INVALID_CONFIG, "Illegal client matching pattern: client_id=a=b"),
        ([("match", OP_SET, "client_id=a,")], INVALID_CONFIG, "Configuration 'match' values must not be empty."),
        # Repeats are dropped before the checks (below): the interval's range is what is refused.
        ([("metrics", OP_SET, "a, a"), ("interval.ms", OP_SET, "5")], INVALID_REQUEST,
         "Invalid value 5 for interval.ms, interval must be between 100 and 3600000 (1 hour)"),
        ([("match", OP_SET, "client_id=(?P<x>a)")], INVALID_CONFIG,
         "Illegal client matching pattern: client_id=(?P<x>a)"),
        ([("metrics", OP_SET, None)], INVALID_REQUEST, "Null value not supported for : metrics"),
        ([("metrics", OP_SET, "a"), ("metrics", OP_DELETE, None)], INVALID_REQUEST,
         "Error due to duplicate config keys"),
        ([("interval.ms", OP_APPEND, "5")], INVALID_CONFIG,
         "Can't APPEND to key interval.ms because its type is not LIST."),
        ([("interval.ms", OP_SUBTRACT, "5")], INVALID_CONFIG,
         "Can't SUBTRACT to key interval.ms because its type is not LIST."),
        ([("metrics", 7, "a")], INVALID_REQUEST, "Unknown alter config operation 7 for metrics"),
    ],
)
def test_invalid_incremental_alter_is_refused_with_kafkas_code_and_message(ops, code, message):
    store = SubscriptionStore()

    error = _refused(lambda: store.incremental_alter("subs", ops))

    assert (error.error_code, error.message) == (code, message)
    assert store.names() == [] and store.generation == 0


@pytest.mark.parametrize("text, value", [
    ("\u0661\u0660\u0660\u0660", 1000), ("-\u0967\u0968", -12), ("+0", 0), ("\uff10" * 20 + "7", 7),
    ("2147483647", 2**31 - 1), ("-2147483648", -2**31), ("2147483648", None), ("9" * 100_000, None), ("", None),
    ("-", None), ("1 2", None), ("\U0001d7cf", None), ("\u00b2", None), ("\u2167", None)])
def test_an_interval_is_read_as_javas_integer_parse_int_reads_it(text, value):
    """Integer.parseInt: any Unicode decimal digit one UTF-16 unit long (not superscripts or numerals), 32 bits."""
    from kcm_common.java import parse_int as java_parse_int

    assert java_parse_int(text) == value


def test_a_value_kafka_holds_already_is_not_refused_for_its_size_only_a_changed_one():
    store = SubscriptionStore()
    store.incremental_alter("subs", [("metrics", OP_SET, "m" * 32767)])
    store.incremental_alter("subs", [("interval.ms", OP_SET, "1000")])   # metrics unchanged, at the limit
    error = _refused(lambda: store.incremental_alter("subs", [("metrics", OP_APPEND, "n")]))
    assert error.error_code == INVALID_CONFIG and "maximum value size of 32767" in error.message
    assert store.configs("subs")["metrics"] == "m" * 32767


def test_a_repeated_list_item_is_dropped_as_kafka_parses_lists_not_refused():
    """ConfigDef.parseValue (Kafka 4.2+, KAFKA-19875) keeps the first of each repeated LIST item, with a warning in the
    broker's log, before ValidList sees the list: accepted, described and matched without the repeats."""
    store = SubscriptionStore()

    store.incremental_alter("subs", _set(metrics="b., a., b.", match="client_id=x,client_id=x"))
    store.incremental_alter("subs", [("metrics", OP_APPEND, "a.")])

    assert {entry.name: entry.value for entry in store.describe("subs", ["metrics", "match"])} == {
        "metrics": "b.,a.", "match": "client_id=x"}
    (subscription,) = store.subscriptions()
    assert (subscription.metrics, subscription.match) == (("b.", "a."), (("client_id", "x"),))


def test_empty_subscription_name_is_an_invalid_request_everywhere():
    store = SubscriptionStore()

    for change in (
        lambda: store.incremental_alter("", _set(metrics="a")),
        lambda: store.incremental_alter("", [("metrics", OP_DELETE, None)]),
        lambda: store.alter("", {"metrics": "a"}),
    ):
        error = _refused(change)
        assert (error.error_code, error.message) == (INVALID_REQUEST, "Subscription name can't be empty")
    error = _refused(lambda: store.describe(""))
    assert (error.error_code, error.message) == (INVALID_REQUEST, "Client metrics subscription name must not be empty")


def test_interval_bounds_are_inclusive():
    store = SubscriptionStore()

    store.incremental_alter("low", _set(interval_ms="100"))
    store.incremental_alter("high", _set(interval_ms="3600000"))

    assert [s.interval_ms for s in store.subscriptions()] == [3600000, 100]


def test_unknown_key_is_checked_before_a_bad_interval():
    error = _refused(lambda: SubscriptionStore().alter("subs", {"interval.ms": "x", "zzz": "1"}))

    assert (error.error_code, error.message) == (INVALID_REQUEST, "Unknown client metrics configuration: zzz")


def test_legacy_alter_with_a_null_value_is_refused():
    error = _refused(lambda: SubscriptionStore().alter("subs", {"metrics": "a", "match": None}))

    assert (error.error_code, error.message) == (INVALID_REQUEST, "Null value not supported for : match")


def test_deleting_a_key_that_was_never_set_succeeds_and_changes_nothing():
    store = SubscriptionStore()
    store.incremental_alter("subs", _set(metrics="a"))

    store.incremental_alter("subs", [("foo", OP_DELETE, None), ("match", OP_DELETE, None)])

    assert store.configs("subs") == {"metrics": "a"} and store.generation == 1


# --- describe and list reflect exactly what was set --------------------------------------------------------------


def test_describe_shows_set_keys_as_client_metrics_config_and_the_rest_as_defaults():
    store = SubscriptionStore()
    store.incremental_alter("subs", _set(metrics="producer. , consumer.", interval_ms=" 60000 "))

    entries = {entry.name: entry for entry in store.describe("subs")}

    # java.util.HashMap order, as ConfigHelperUtils.createResponseConfig streams it
    assert [entry.name for entry in store.describe("subs")] == ["interval.ms", "match", "metrics"]
    # Kafka describes the parsed value, so spaces around commas and numbers are gone.
    metrics, interval, match = entries["metrics"], entries["interval.ms"], entries["match"]
    assert metrics.value == "producer.,consumer."
    assert (metrics.source, metrics.is_default, metrics.config_type) == (CLIENT_METRICS_CONFIG_SOURCE, False, 7)
    assert (interval.value, interval.source, interval.config_type) == ("60000", CLIENT_METRICS_CONFIG_SOURCE, 3)
    assert (match.value, match.source, match.is_default, match.config_type) == ("", DEFAULT_CONFIG_SOURCE, True, 7)
    assert not any(entry.read_only or entry.sensitive for entry in entries.values())
    assert entries["interval.ms"].documentation == "Metrics push interval in milliseconds"


def test_describe_filters_by_requested_keys():
    store = SubscriptionStore()
    store.incremental_alter("subs", _set(match="client_id=a.*"))

    assert [(e.name, e.value) for e in store.describe("subs", ["match", "nonsense"])] == [("match", "client_id=a.*")]
    assert len(store.describe("subs", [])) == 3


def test_a_subscription_that_does_not_exist_describes_as_defaults_and_is_not_listed():
    store = SubscriptionStore()

    assert _values(store, "ghost") == {
        "metrics": ("", DEFAULT_CONFIG_SOURCE),
        "interval.ms": ("300000", DEFAULT_CONFIG_SOURCE),
        "match": ("", DEFAULT_CONFIG_SOURCE),
    }
    assert store.names() == []


def test_names_lists_every_subscription_sorted():
    store = SubscriptionStore()
    for name in ("b", "a", "c"):
        store.incremental_alter(name, _set(metrics="*"))

    assert store.names() == ["a", "b", "c"]


# --- incremental operations ---------------------------------------------------------------------------------------


def test_set_then_delete_each_key_and_the_last_delete_removes_the_subscription():
    store = SubscriptionStore()
    store.incremental_alter("subs", _set(metrics="a", interval_ms="1000", match="client_id=x"))

    store.incremental_alter("subs", [("metrics", OP_DELETE, None), ("match", OP_DELETE, None)])
    assert store.configs("subs") == {"interval.ms": "1000"} and store.names() == ["subs"]

    store.incremental_alter("subs", [("interval.ms", OP_DELETE, None)])
    assert store.names() == [] and store.subscriptions() == []
    assert _values(store, "subs")["interval.ms"] == ("300000", DEFAULT_CONFIG_SOURCE)


def test_append_adds_missing_items_to_a_list_key_even_when_unset():
    store = SubscriptionStore()

    store.incremental_alter("subs", [("metrics", OP_APPEND, "a,b")])
    store.incremental_alter("subs", [("metrics", OP_APPEND, "b,c")])
    store.incremental_alter("subs", [("match", OP_APPEND, "client_id=x")])

    assert store.configs("subs") == {"metrics": "a,b,c", "match": "client_id=x"}


def test_subtract_removes_items_and_subtracting_everything_leaves_an_empty_value_set():
    store = SubscriptionStore()
    store.incremental_alter("subs", _set(metrics="a,b,c"))

    store.incremental_alter("subs", [("metrics", OP_SUBTRACT, "b,zzz")])
    assert store.configs("subs") == {"metrics": "a,c"}

    store.incremental_alter("subs", [("metrics", OP_SUBTRACT, "a,c")])
    assert store.names() == ["subs"]
    assert _values(store, "subs")["metrics"] == ("", CLIENT_METRICS_CONFIG_SOURCE)


def test_legacy_alter_replaces_every_config_and_an_empty_alter_removes_the_subscription():
    store = SubscriptionStore()
    store.alter("subs", {"metrics": "a", "interval.ms": "1000"})

    store.alter("subs", {"match": "client_id=x"})
    assert store.configs("subs") == {"match": "client_id=x"}

    store.alter("subs", {})
    assert store.names() == []


def test_validate_only_checks_without_changing_anything():
    store = SubscriptionStore()

    store.incremental_alter("subs", _set(metrics="a"), validate_only=True)
    store.alter("subs", {"metrics": "a"}, validate_only=True)
    error = _refused(lambda: store.incremental_alter("subs", _set(interval_ms="1"), validate_only=True))

    assert error.error_code == INVALID_REQUEST
    assert store.names() == [] and store.generation == 0


def test_generation_bumps_only_on_effective_changes():
    store = SubscriptionStore()
    store.incremental_alter("subs", _set(metrics="a"))
    assert store.generation == 1

    store.incremental_alter("subs", _set(metrics="a"))
    store.incremental_alter("other", [("metrics", OP_DELETE, None)])
    _refused(lambda: store.incremental_alter("subs", _set(interval_ms="0")))
    assert store.generation == 1

    store.incremental_alter("subs", [("metrics", OP_DELETE, None)])
    assert store.generation == 2


def test_subscriptions_are_parsed_with_defaults_and_a_repeated_match_key_keeps_its_last_pattern():
    store = SubscriptionStore()
    store.incremental_alter("subs", _set(match="client_id=a.*, client_software_name = librdkafka ,client_id=b.*"))

    assert store.subscriptions() == [
        Subscription(
            name="subs",
            metrics=(),
            interval_ms=300000,
            match=(("client_id", "b.*"), ("client_software_name", "librdkafka")),
        )
    ]


# --- persistence -------------------------------------------------------------------------------------------------


def test_a_new_store_on_the_same_file_sees_every_change(tmp_path):
    state = tmp_path / "state" / "subscriptions.json"
    store = SubscriptionStore(state)
    store.incremental_alter("keep", _set(metrics="a", interval_ms="1000"))
    store.incremental_alter("gone", _set(metrics="b"))
    store.incremental_alter("gone", [("metrics", OP_DELETE, None)])

    reopened = SubscriptionStore(state)

    assert reopened.names() == ["keep"]
    assert reopened.configs("keep") == {"metrics": "a", "interval.ms": "1000"}
    assert [path.name for path in state.parent.iterdir()] == ["subscriptions.json"]  # no temp files left behind


def test_refused_and_validate_only_changes_are_not_written(tmp_path):
    state = tmp_path / "subscriptions.json"
    store = SubscriptionStore(state)
    store.incremental_alter("subs", _set(metrics="a"))
    _refused(lambda: store.incremental_alter("subs", _set(interval_ms="1")))
    store.incremental_alter("subs", _set(metrics="b"), validate_only=True)

    assert SubscriptionStore(state).configs("subs") == {"metrics": "a"}


def test_an_unreadable_state_file_is_reported_with_its_path(tmp_path):
    state = tmp_path / "subscriptions.json"
    state.write_text("{not json")

    with pytest.raises(StateFileError, match="subscriptions.json"):
        SubscriptionStore(state)


def test_a_state_file_nesting_deeper_than_python_can_read_is_reported_with_its_path(tmp_path):
    state = tmp_path / "subscriptions.json"
    state.write_text("[" * 100_000 + "]" * 100_000)

    with pytest.raises(StateFileError, match="subscriptions.json"):
        SubscriptionStore(state)


def test_interval_ms_with_leading_zeros_is_a_number_as_java_reads_it():
    store = SubscriptionStore()

    store.incremental_alter("subs", [("interval.ms", OP_SET, "0" * 20 + "60000")])

    assert store.configs("subs") == {"interval.ms": "0" * 20 + "60000"}   # accepted, and kept as written


def test_an_invalid_subscription_in_the_state_file_is_reported(tmp_path):
    state = tmp_path / "subscriptions.json"
    state.write_text(json.dumps({"version": 1, "subscriptions": {"subs": {"interval.ms": "5"}}}))

    with pytest.raises(StateFileError, match="'subs' is invalid: Invalid value 5 for interval.ms"):
        SubscriptionStore(state)


def test_a_state_file_that_cannot_be_written_is_refused_at_start_not_at_the_first_change(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")

    with pytest.raises(StateFileError, match=r"^--state .*/a-file/subscriptions.json: cannot write there \("):
        SubscriptionStore(blocker / "subscriptions.json")


def test_a_change_that_cannot_be_saved_is_refused_and_changes_nothing(tmp_path, monkeypatch, caplog):
    from kcm_sandbox import store as store_module

    state = tmp_path / "subscriptions.json"
    store = SubscriptionStore(state)
    store.incremental_alter("subs", _set(metrics="a"))

    def disk_full(path, configs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store_module, "_save_state", disk_full)
    with pytest.raises(ConfigError) as refused:
        store.incremental_alter("subs", _set(metrics="b"))
    assert (refused.value.error_code, refused.value.message) == (
        -1, "the sandbox cannot save its state file: No space left on device")
    assert store.configs("subs") == {"metrics": "a"} and "the change to subs is refused" in caplog.text


# --- Java behaviour the rules depend on (kcm_common.java); expected values printed by JDK 17's jshell ----------


@pytest.mark.parametrize(("pattern", "text", "java_result"), [
    ("(?P<name>payments)", "payments", None),  # Python-only named group: PatternSyntaxException
    ("(?#c)payments", "payments", None),  # Python-only comment
    ("pay{ments", "payments", None),  # a "{" that is not a quantifier
    ("x{2,1}", "xx", None),
    ("a{,3}", "a", None),
    (r"\p{Alpha}+", "payments", True),
    (r"\Qpay.ments\E", "pay.ments", True),
    (r"\Qpay.ments\E", "payXments", False),
    ("(?<name>payments)", "payments", True),
    (r"pay\d+", "pay\u0661\u0662", False),  # \d, \w, \s are ASCII-only in Java
    (r"\w+", "p\u00e4yments", False),
    (r"a\sb", "a\u00a0b", False),
    ("[]a]", "]", True),
    (r"\h", "\u00a0", True),
    (r"\p{L}+-app", "caf\u00e9-app", True),  # Unicode properties are Unicode; only POSIX classes are ASCII
    (r"\pL", "\u00e9", True),
    (r"\p{Lu}", "\u00c9", True),
    (r"\P{L}", "\u00e9", False),
    (r"\p{IsLatin}", "\u00e9", True),
    (r"\p{InGreek}", "\u03b1", True),
    (r"\p{IsAlphabetic}", "\u00e9", True),
    (r"\p{N}", "\u0663", True),
    (r"\p{javaLowerCase}", "\u00e9", True),
    (r"\p{IsL}", "\u00e9", True),
    (r"\p{IsLu}", "\u00e9", False),
    (r"\p{Alpha}", "\u00e9", False),
    (r"[\p{Alpha}]", "\u00e9", False),
    (r"[\p{L}]", "\u00e9", True),
    (r"[^\p{L}]", "\u00e9", False),
    (r"[\p{L}\d]+", "\u00e93", True),
    (r"[\p{L}\d]+", "\u00e9\u0663", False),  # \d stays ASCII in a class with a Unicode property
    (r"[\w\p{Lu}]+", "\u00c9\u00e4", False),
    (r"[\D]", "\u0663", True),
    (r"[\W]", "\u00e9", True),
    (r"[\S]", "\u00a0", True),
    (r"[\d]+", "\u0663", False),
    ("(?i)\u00e9", "\u00c9", False),  # case-insensitive for ASCII only
    (r"(?<n>a)\k<n>", "aa", True),
    (r"\N{LATIN SMALL LETTER E WITH ACUTE}", "\u00e9", True),
    (".", "\r", False),  # `.` stops at every Java line terminator unless (?s)
    (".", "\n", False),
    ("a.c", "a\u2029c", False),
    ("a.c", "a\u0085c", False),
    ("a.c", "axc", True),
    ("(?s).", "\r", True),
    ("(?s:a.)c", "a\rc", True),
    ("(?s:a).", "\r", False),
    ("a(?s).", "a\r", True),
    ("(a(?s)).", "a\r", False),
])
def test_patterns_compile_and_match_as_java_util_regex_does(pattern, text, java_result):
    if java_result is None:
        with pytest.raises(PatternError):
            compile_pattern(pattern)
    else:
        assert (compile_pattern(pattern).fullmatch(text) is not None) is java_result


def test_hash_order_is_java_hash_set_iteration_order_including_after_a_resize():
    items = [f"org.apache.kafka.m{i}" for i in range(20)] + ["*", "\u00e9t\u00e9"]
    java = ["org.apache.kafka.m19", "org.apache.kafka.m18", "org.apache.kafka.m17", "*", "org.apache.kafka.m16",
            "org.apache.kafka.m15", "org.apache.kafka.m14", "org.apache.kafka.m13", "org.apache.kafka.m12",
            "org.apache.kafka.m11", "org.apache.kafka.m0", "org.apache.kafka.m10"] + [
        f"org.apache.kafka.m{i}" for i in range(1, 10)] + ["\u00e9t\u00e9"]

    assert hash_order(items) == java
    assert hash_order(items, copy_capacity(len(items))) == java


def test_split_drops_trailing_empty_strings_as_java_string_split_does():
    assert (split("a,b,,", ","), split("", ","), split(",a", ",")) == (["a", "b"], [""], ["", "a"])


def test_a_list_value_is_trimmed_before_it_is_split_as_kafkas_config_def_does():
    from kcm_common.client_metrics import describe_entries, parse_list

    assert parse_list("  a , b  ") == ["a", "b"] and parse_list(" \t ") == []
    assert describe_entries({"metrics": " a,b "}, ["metrics"])[0].value == "a,b"
