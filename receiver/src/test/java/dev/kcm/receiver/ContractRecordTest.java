package dev.kcm.receiver;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;

import java.net.InetAddress;
import java.nio.charset.StandardCharsets;
import java.util.Map;

import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.network.ClientInformation;
import org.apache.kafka.common.security.auth.KafkaPrincipal;
import org.apache.kafka.common.security.auth.SecurityProtocol;
import org.apache.kafka.server.authorizer.AuthorizableRequestContext;
import org.junit.jupiter.api.Test;

class ContractRecordTest {
    private static final byte[] METRICS = {0x0a, 0x02, 0x0a, 0x00};

    @Test
    void aFullRequestContextGivesEveryIdentityAndBrokerHeader() {
        ProducerRecord<byte[], byte[]> record = ContractRecord.build("metrics",
                Fixtures.push(Fixtures.requestContext(), METRICS, 30000), "3", "cluster-x");
        assertEquals("metrics", record.topic());
        assertEquals("01234567-89ab-cdef-0fed-cba987654321", new String(record.key(), StandardCharsets.UTF_8));
        assertArrayEquals(METRICS, record.value());
        assertEquals(Map.ofEntries(
                Map.entry("content-type", "application/x-protobuf"),
                Map.entry("content-encoding", "none"),
                Map.entry("client_instance_id", "01234567-89ab-cdef-0fed-cba987654321"),
                Map.entry("client_id", "payments-1"),
                Map.entry("client_software_name", "apache-kafka-java"),
                Map.entry("client_software_version", "4.3.0"),
                Map.entry("client_source_address", "10.1.2.3"),
                Map.entry("client_source_port", "51234"),
                Map.entry("principal", "User:alice"),
                Map.entry("listener_name", "SASL_SSL"),
                Map.entry("security_protocol", "SASL_SSL"),
                Map.entry("broker_id", "3"),
                Map.entry("cluster_id", "cluster-x"),
                Map.entry("push_interval_ms", "30000"),
                Map.entry("terminating", "false")), Fixtures.headers(record));
    }

    @Test
    void headersThePluginCannotKnowAreAbsentNotEmpty() {
        ProducerRecord<byte[], byte[]> record = ContractRecord.build("metrics",
                Fixtures.push(plainContext(), METRICS, null), null, null);
        Map<String, String> headers = Fixtures.headers(record);
        for (String absent : new String[] {"client_software_name", "client_software_version", "client_source_port",
                "push_interval_ms", "broker_id", "cluster_id", "subscription_id"}) {
            assertFalse(headers.containsKey(absent), absent);
        }
        assertEquals("tool-7", headers.get("client_id"));
        assertEquals("192.0.2.9", headers.get("client_source_address"));
        assertEquals("User:ANONYMOUS", headers.get("principal"));
    }

    @Test
    void softwareKafkaRecordsAsUnknownIsLeftOut() {
        ProducerRecord<byte[], byte[]> record = ContractRecord.build("metrics", Fixtures.push(
                Fixtures.requestContext("old", ClientInformation.EMPTY, null), METRICS, null), "1", "c");
        Map<String, String> headers = Fixtures.headers(record);
        assertFalse(headers.containsKey("client_software_name"));
        assertFalse(headers.containsKey("client_software_version"));
        assertFalse(headers.containsKey("client_source_port"));
    }

    @Test
    void compressedBytesFromKafka37AreRecognisedByTheirMagic() {
        assertEquals("zstd", ContractRecord.contentEncoding(new byte[] {0x28, (byte) 0xB5, 0x2F, (byte) 0xFD, 1}));
        assertEquals("lz4", ContractRecord.contentEncoding(new byte[] {0x04, 0x22, 0x4D, 0x18, 1}));
        assertEquals("gzip", ContractRecord.contentEncoding(new byte[] {0x1F, (byte) 0x8B, 8}));
        assertEquals("snappy", ContractRecord.contentEncoding(
                new byte[] {(byte) 0x82, 'S', 'N', 'A', 'P', 'P', 'Y', 0, 0, 0, 0, 1}));
        assertEquals("none", ContractRecord.contentEncoding(METRICS));
        assertEquals("none", ContractRecord.contentEncoding(new byte[] {0x28}));
        ProducerRecord<byte[], byte[]> record = ContractRecord.build("metrics", Fixtures.push(Fixtures.requestContext(),
                new byte[] {0x1F, (byte) 0x8B, 8, 0}, null), "1", "c");
        assertEquals("gzip", Fixtures.headers(record).get("content-encoding"));
    }

    @Test
    void aTerminatingPushSaysSo() {
        Push push = new Push(Fixtures.requestContext(), Fixtures.INSTANCE, true, null, METRICS, null);
        Map<String, String> headers = Fixtures.headers(ContractRecord.build("metrics", push, "1", "c"));
        assertEquals("true", headers.get("terminating"));
        assertEquals("application/x-protobuf", headers.get("content-type"));
    }

    @Test
    void theContentTypeABrokerGivesIsWrittenAsTheContractsMediaType() {
        // Every broker says "OTLP" (PushTelemetryRequest.metricsContentType()); copied as it was, no reader knew it.
        assertEquals("OTLP", Fixtures.BROKER_CONTENT_TYPE);
        for (String given : new String[] {Fixtures.BROKER_CONTENT_TYPE, "otlp", "", null}) {
            Push push = new Push(Fixtures.requestContext(), Fixtures.INSTANCE, false, given, METRICS, null);
            assertEquals("application/x-protobuf",
                    Fixtures.headers(ContractRecord.build("metrics", push, "1", "c")).get("content-type"), given);
        }
        // A type a later Kafka may add is written as it comes: readers refuse it by name, never misread it.
        Push other = new Push(Fixtures.requestContext(), Fixtures.INSTANCE, false, "application/json", METRICS, null);
        assertEquals("application/json",
                Fixtures.headers(ContractRecord.build("metrics", other, "1", "c")).get("content-type"));
    }

    /** A context from an authorizer-style wrapper: only the AuthorizableRequestContext interface. */
    private static AuthorizableRequestContext plainContext() {
        return new AuthorizableRequestContext() {
            @Override
            public String listenerName() {
                return "PLAINTEXT";
            }

            @Override
            public SecurityProtocol securityProtocol() {
                return SecurityProtocol.PLAINTEXT;
            }

            @Override
            public KafkaPrincipal principal() {
                return KafkaPrincipal.ANONYMOUS;
            }

            @Override
            public InetAddress clientAddress() {
                return address();
            }

            @Override
            public int requestType() {
                return 72;
            }

            @Override
            public int requestVersion() {
                return 0;
            }

            @Override
            public String clientId() {
                return "tool-7";
            }

            @Override
            public int correlationId() {
                return 1;
            }
        };
    }

    private static InetAddress address() {
        try {
            return InetAddress.getByName("192.0.2.9");
        } catch (java.net.UnknownHostException e) {
            throw new AssertionError(e);
        }
    }
}
