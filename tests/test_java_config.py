"""A `--command-config` file and its `sasl.jaas.config` read as Java reads them: java.util.Properties and Kafka's
JaasConfig (through JaasContext, as a client loads it), compared with a real JVM on the same texts."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from kcm_common.java_config import properties_text, JavaConfigError, parse_jaas, read_properties
from kcm_common.kafka import KafkaConfigError, KafkaSettings, kafka_python_options, load_properties, parse_properties
from kcm_common.kafka_java import java_client_properties
from kcm_sandbox.java_receiver import ensure_built, runtime_classpath

_PROBE = r"""
import java.io.*;
import java.nio.charset.StandardCharsets;
import java.nio.file.*;
import java.util.*;
import org.apache.kafka.common.config.types.Password;
import org.apache.kafka.common.security.JaasContext;

public class ConfigProbe {
    static String hex(String s) {
        StringBuilder out = new StringBuilder();
        for (byte b : s.getBytes(StandardCharsets.UTF_8)) out.append(String.format("%02x", b));
        return out.toString();
    }
    public static void main(String[] args) throws Exception {
        for (int i = 1; i < args.length; i++) {
            String text = new String(Files.readAllBytes(Paths.get(args[i])), StandardCharsets.UTF_8);
            Map<String, String> found = new TreeMap<>();
            try {
                if (args[0].equals("properties")) {
                    Properties properties = new Properties();
                    properties.load(new StringReader(text));
                    for (String key : properties.stringPropertyNames()) found.put(key, properties.getProperty(key));
                } else {
                    Map<String, Object> configs = new HashMap<>();
                    configs.put("sasl.jaas.config", new Password(text));
                    JaasContext context = JaasContext.loadClientContext(configs);
                    for (Map.Entry<String, ?> option : context.configurationEntries().get(0).getOptions().entrySet())
                        found.put(option.getKey(), (String) option.getValue());
                }
            } catch (IllegalArgumentException e) {
                System.out.println("ERR");
                continue;
            }
            StringBuilder line = new StringBuilder("OK");
            for (Map.Entry<String, String> entry : found.entrySet())
                line.append(' ').append(hex(entry.getKey())).append('=').append(hex(entry.getValue()));
            System.out.println(line);
        }
    }
}
"""

PROPERTIES = [
    '# comment\n! also a comment\nsecurity.protocol = SASL_SSL\nsasl.jaas.config=org.Plain required \\\n'
    '  username="svc" password="s3cr\\\\\\"et";\nclient.id:kcm\n',
    "a\\=b=c\\td\\u00e9\\\\\n\\ key\\:x = 1\n",
    "key = value with trailing spaces  \n",
    "odd=b\\\\\\\n   c\neven=b\\\\\n  c=d\n",
    "a=b\\\n  #not a comment\n  ! nor this\n",
    "a=1\r\nb=2\rc=3\r\n",
    "a=b\\\n\nc=d",
    "at.the.end=b\\",
    "p=pässwörd ünïcode\n",
    "a:b\nc d\ne = = f\ng==h\n\tindented=yes\n\f\tk\\ ey = v\n",
    "only.a.key.and.space \n",
    "   \n\t\n# all comments \\\nstill=read\n",
    "windows=C:\\\\Users\\\\kcm\\\\ca.pem\nescaped.hash=\\#1\n",
]

JAAS = [
    "org.apache.kafka.common.security.plain.PlainLoginModule required username=alice password=secret;",
    'x.PlainLoginModule required username="alice" password="s\\"e\\\\cret";',
    "x.PlainLoginModule required username='alice' password='x y \"z\"';",
    'x.ScramLoginModule REQUIRED /* a comment */ username="u" // to the end of the line\n password="p\\101\\7\\477";',
    'x.M Optional username=a-b_c$d.e9 password="\\n\\t\\q\\v";',
    'x.M required\n\tusername = "multi"\r\n\tpassword = "line";\n',
    "x.M required username=\"é\" password='ünï';",
    'x.M required username="unterminated\npassword="b";',
    # Refused by Java (each for its own reason):
    "x.M required username=alice.b password=p@ss;",
    'x.M required username="a" password="b"',
    "x.M required username=a1 password=123;",
    'x.M bogus username="a";',
    'x.M required username="a"; y.M required password="b";',
    "",
    "   /* nothing but a comment */ ",
    'x.M required username="a" password=-;',
    'x.M required username "a";',
    '"" required username="a";',
    'x.M',
    'x.M required username',
    'x.M required username=',
    'x.M required username=-5 password=٣;',
]


@pytest.fixture(scope="module")
def java_probe(tmp_path_factory) -> tuple[Path, str]:
    ensure_built()
    directory = tmp_path_factory.mktemp("probe")
    (directory / "ConfigProbe.java").write_text(_PROBE)
    classpath = runtime_classpath()
    subprocess.run(["javac", "-cp", classpath, "-d", str(directory), str(directory / "ConfigProbe.java")],
                   check=True, capture_output=True, timeout=120)
    return directory, classpath


def _java(probe: tuple[Path, str], kind: str, texts: list[str]) -> list[dict[str, str] | None]:
    directory, classpath = probe
    files = []
    for index, text in enumerate(texts):
        path = directory / f"{kind}-{index}.txt"
        path.write_bytes(text.encode("utf-8"))
        files.append(str(path))
    done = subprocess.run(["java", "-Xmx64m", "-XX:TieredStopAtLevel=1", "-cp", f"{directory}:{classpath}",
                           "ConfigProbe", kind, *files], capture_output=True, text=True, timeout=60, check=True)
    results: list[dict[str, str] | None] = []
    for line in done.stdout.splitlines():
        if line == "ERR":
            results.append(None)
            continue
        pairs = (item.split("=") for item in line.split()[1:])
        results.append({bytes.fromhex(k).decode(): bytes.fromhex(v).decode() for k, v in pairs})
    assert len(results) == len(texts), done.stdout
    return results


def _python_properties(text: str) -> dict[str, str]:
    return {entry.key: entry.value for entry in read_properties(text)}


def _python_jaas(text: str) -> dict[str, str] | None:
    try:
        entries = parse_jaas(text)
    except JavaConfigError:
        return None
    return entries[0].options if len(entries) == 1 else None


def test_properties_files_read_as_java_util_properties_reads_them(java_probe):
    expected = _java(java_probe, "properties", PROPERTIES)
    assert [_python_properties(text) for text in PROPERTIES] == expected
    assert expected[0]["sasl.jaas.config"] == 'org.Plain required username="svc" password="s3cr\\"et";'
    assert expected[2] == {"key": "value with trailing spaces  "}


def test_properties_kcm_writes_for_a_jvm_are_read_back_exactly_by_java(java_probe):
    # How the sandbox hands a JVM its settings (credentials among them) without putting them on its command line.
    entries = {"sasl.jaas.config": 'org.Plain required username="svc" password="p w\\"=:#!";',
               "key with=separators:and #": " leading space, trailing space ", "#hash": "!bang",
               "back\\slash": "tab\there\nnewline\rcr\fff", "unicode": "pässwörd ✓", "empty": "", "!": "#"}
    text = properties_text(entries)
    assert _java(java_probe, "properties", [text]) == [entries]
    assert _python_properties(text) == entries


def test_jaas_lines_read_as_kafka_reads_them(java_probe):
    expected = _java(java_probe, "jaas", JAAS)
    assert [_python_jaas(text) for text in JAAS] == expected
    assert expected[0] == {"username": "alice", "password": "secret"}
    assert expected.count(None) == 14   # the refused ones above are refused by Java too


def test_an_unquoted_jaas_line_logs_in_with_its_username_and_password():
    options = kafka_python_options({"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.jaas.config":
                                    "org.apache.kafka.common.security.plain.PlainLoginModule required "
                                    "username=alice password=S3cr3t;"})
    assert (options["sasl_plain_username"], options["sasl_plain_password"]) == ("alice", "S3cr3t")


def test_an_escaped_quote_in_a_jaas_password_reaches_the_client_unescaped():
    # Before: the escaping backslash went along with the password, and the login failed for no visible reason.
    options = kafka_python_options({"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-256",
                                    "sasl.jaas.config": 'x.ScramLoginModule required username="u" password="a\\"b\\\\c";'})
    assert options["sasl_plain_password"] == 'a"b\\c'


@pytest.mark.parametrize(("jaas", "message"), [
    ("x.PlainLoginModule required username=alice password=p@S3cr3t;", "no value for an option"),
    ('x.PlainLoginModule required username="alice" password="S3cr3t"', "does not end with a semicolon"),
    ("x.PlainLoginModule required username=alice password=123456;", "no value for option 'password'"),
    ('x.PlainLoginModule S3cr3t username="alice";', "invalid login module control flag"),
    ('x.PlainLoginModule required username="alice";', "has no password option"),
    ('x.A required username="a" password="S3cr3t"; x.B required username="a" password="b";', "2 login modules"),
    ("", "no login module given"),
])
def test_a_jaas_line_java_would_refuse_says_why_and_never_shows_the_secret(jaas, message):
    with pytest.raises(KafkaConfigError) as raised:
        kafka_python_options({"security.protocol": "SASL_SSL", "sasl.jaas.config": jaas})
    assert message in str(raised.value)
    assert "S3cr3t" not in str(raised.value)


def test_a_malformed_unicode_escape_is_named_by_line_never_quoted():
    with pytest.raises(KafkaConfigError) as raised:
        parse_properties("security.protocol=SASL_SSL\nsasl.password=S3cr3t\\u12\n")
    assert str(raised.value) == ("cannot read the property on line 2: malformed \\uXXXX escape "
                                 "(four hex digits expected)")


@pytest.mark.parametrize("password", ['pa"ss\\word', "two\nlines\r\n", "'single' and /* not a comment */ // nor this",
                                      "ünïcode ;="])
def test_the_jaas_line_kcm_writes_for_java_clients_reads_back_as_the_password_given(password):
    properties = java_client_properties(KafkaSettings("127.0.0.1:9092", {
        "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "u",
        "sasl.password": password}))
    (entry,) = parse_jaas(properties["sasl.jaas.config"])
    assert entry.options == {"username": "u", "password": password}


def test_a_jaas_line_beside_a_protocol_without_sasl_is_ignored_as_java_clients_ignore_it():
    options = kafka_python_options({"security.protocol": "SSL", "sasl.jaas.config": "left over from another setup"})
    assert "sasl_plain_username" not in options and options["security_protocol"] == "SSL"


def test_a_byte_order_mark_a_windows_editor_wrote_is_not_part_of_the_first_key(tmp_path):
    config = tmp_path / "client.properties"
    config.write_bytes("security.protocol=SASL_SSL\nsasl.username=u\nsasl.password=p\n".encode("utf-8-sig"))
    assert load_properties(config)["security.protocol"] == "SASL_SSL"
