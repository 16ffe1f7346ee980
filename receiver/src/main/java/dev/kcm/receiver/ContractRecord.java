package dev.kcm.receiver;

import java.lang.reflect.Field;
import java.net.InetAddress;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Optional;
import java.util.UUID;

import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeader;
import org.apache.kafka.common.network.ClientInformation;
import org.apache.kafka.common.requests.RequestContext;
import org.apache.kafka.server.authorizer.AuthorizableRequestContext;

/** Builds the metrics-topic contract v1 record of one push; headers the broker does not know are left out. */
final class ContractRecord {
    static final String CONTENT_TYPE_PROTOBUF = "application/x-protobuf";

    private static final byte[] ZSTD_MAGIC = {0x28, (byte) 0xB5, 0x2F, (byte) 0xFD};
    private static final byte[] LZ4_MAGIC = {0x04, 0x22, 0x4D, 0x18};
    private static final byte[] GZIP_MAGIC = {0x1F, (byte) 0x8B};
    private static final byte[] XERIAL_MAGIC = {(byte) 0x82, 'S', 'N', 'A', 'P', 'P', 'Y', 0};

    private ContractRecord() {
    }

    static ProducerRecord<byte[], byte[]> build(String topic, Push push, String brokerId, String clusterId) {
        UUID instance = new UUID(push.clientInstanceId.getMostSignificantBits(),
                push.clientInstanceId.getLeastSignificantBits());
        AuthorizableRequestContext context = push.context;
        List<Header> headers = new ArrayList<>(16);
        add(headers, "content-type", mediaType(push.contentType));
        add(headers, "content-encoding", contentEncoding(push.data));
        add(headers, "client_instance_id", instance.toString());
        add(headers, "client_id", context.clientId());
        // Software name, version and source port exist only on the broker's own RequestContext class.
        RequestContext full = context instanceof RequestContext ? (RequestContext) context : null;
        if (full != null && full.clientInformation != null) {
            add(headers, "client_software_name", known(full.clientInformation.softwareName()));
            add(headers, "client_software_version", known(full.clientInformation.softwareVersion()));
        }
        InetAddress address = context.clientAddress();
        add(headers, "client_source_address", address == null ? null : address.getHostAddress());
        Object port = clientPort(full);
        if (port instanceof Optional<?> present && present.isPresent()) {
            add(headers, "client_source_port", String.valueOf(present.get()));
        }
        add(headers, "principal", context.principal() == null ? null : context.principal().toString());
        add(headers, "listener_name", context.listenerName());
        add(headers, "security_protocol", context.securityProtocol() == null ? null : context.securityProtocol().name);
        add(headers, "broker_id", brokerId);
        add(headers, "cluster_id", clusterId);
        add(headers, "push_interval_ms", push.pushIntervalMs == null ? null : String.valueOf(push.pushIntervalMs));
        add(headers, "terminating", push.terminating ? "true" : "false");
        // Timestamped when the broker accepted the push, not when the producer got it (after the queue, maybe an
        // outage): readers window by the record's timestamp.
        return new ProducerRecord<>(topic, null, push.acceptedMs, instance.toString().getBytes(StandardCharsets.UTF_8),
                push.data, headers);
    }

    /**
     * The contract's media type for the content type Kafka hands the plugin. Every broker from 3.7 on says "OTLP"
     * (PushTelemetryRequest.metricsContentType(), a constant: KIP-714 pushes are OTLP protobuf); copied as it was,
     * no kcm reader knew it. A type some later Kafka may add is written as it comes, and readers refuse it by name.
     */
    static String mediaType(String kafkaContentType) {
        if (kafkaContentType == null || kafkaContentType.isEmpty() || kafkaContentType.equalsIgnoreCase("OTLP")) {
            return CONTENT_TYPE_PROTOBUF;
        }
        return kafkaContentType;
    }

    // RequestContext.clientPort arrived in Kafka 3.8: looked up once, so a 3.7 broker gets records without the port
    // instead of a NoSuchFieldError.
    private static final Field CLIENT_PORT = clientPortField();

    private static Field clientPortField() {
        try {
            return RequestContext.class.getField("clientPort");
        } catch (NoSuchFieldException | SecurityException e) {
            return null;
        }
    }

    private static Object clientPort(RequestContext context) {
        if (context == null || CLIENT_PORT == null) {
            return null;
        }
        try {
            return CLIENT_PORT.get(context);
        } catch (IllegalAccessException e) {
            return null;
        }
    }

    /** Kafka 3.8+ hand over decompressed bytes; 3.7 handed the client's compressed ones, recognised by magic. */
    static String contentEncoding(byte[] data) {
        if (startsWith(data, ZSTD_MAGIC)) {
            return "zstd";
        }
        if (startsWith(data, LZ4_MAGIC)) {
            return "lz4";
        }
        if (startsWith(data, GZIP_MAGIC)) {
            return "gzip";
        }
        if (startsWith(data, XERIAL_MAGIC)) {
            return "snappy";
        }
        return "none";
    }

    private static boolean startsWith(byte[] data, byte[] magic) {
        if (data.length < magic.length) {
            return false;
        }
        for (int i = 0; i < magic.length; i++) {
            if (data[i] != magic[i]) {
                return false;
            }
        }
        return true;
    }

    // "unknown" is what Kafka records when the client never said (ApiVersions below v3).
    private static String known(String value) {
        return ClientInformation.UNKNOWN_NAME_OR_VERSION.equals(value) ? null : value;
    }

    private static void add(List<Header> headers, String name, String value) {
        if (value != null) {
            headers.add(new RecordHeader(name, value.getBytes(StandardCharsets.UTF_8)));
        }
    }
}
