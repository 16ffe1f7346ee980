package dev.kcm.receiver.host;

import java.io.BufferedInputStream;
import java.io.BufferedOutputStream;
import java.io.DataInputStream;
import java.io.DataOutputStream;
import java.io.EOFException;
import java.io.IOException;
import java.io.StringReader;
import java.net.InetAddress;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.Map;
import java.util.Objects;
import java.util.Optional;
import java.util.Properties;

import org.apache.kafka.common.Uuid;
import org.apache.kafka.common.message.PushTelemetryRequestData;
import org.apache.kafka.common.metrics.KafkaMetricsContext;
import org.apache.kafka.common.metrics.MetricsReporter;
import org.apache.kafka.common.network.ClientInformation;
import org.apache.kafka.common.network.ListenerName;
import org.apache.kafka.common.protocol.ApiKeys;
import org.apache.kafka.common.requests.PushTelemetryRequest;
import org.apache.kafka.common.requests.RequestContext;
import org.apache.kafka.common.requests.RequestHeader;
import org.apache.kafka.common.security.auth.KafkaPrincipal;
import org.apache.kafka.common.security.auth.SecurityProtocol;
import org.apache.kafka.server.authorizer.AuthorizableRequestContext;
import org.apache.kafka.server.telemetry.ClientTelemetry;
import org.apache.kafka.server.telemetry.ClientTelemetryContext;
import org.apache.kafka.server.telemetry.ClientTelemetryExporter;
import org.apache.kafka.server.telemetry.ClientTelemetryExporterProvider;
import org.apache.kafka.server.telemetry.ClientTelemetryPayload;
import org.apache.kafka.server.telemetry.ClientTelemetryReceiver;

/**
 * Hosts a receiver plugin as a broker does, for the sandbox: configure, contextChange, then one exportMetrics call
 * per push read from stdin. Usage: ReceiverHost API(3.8|4.2) PLUGIN_CLASS CLUSTER_ID BROKER_ID [key=value ...].
 *
 * <p>Frames (big-endian): instance id (2 longs), terminating (byte), client id, software name, software version,
 * source address (each an int length, -1 for none, then UTF-8), source port (int, -1 for none), push interval ms
 * (int), data (int length, bytes). Each is answered on stdout with 0, or 1 and an error text; 'R' means ready.
 */
public final class ReceiverHost {
    // What a broker hands its plugin as the payload's content type: "OTLP" in every Kafka from 3.7 on.
    static final String CONTENT_TYPE = new PushTelemetryRequest(new PushTelemetryRequestData(), (short) 0)
            .metricsContentType();
    private static final ListenerName LISTENER = ListenerName.forSecurityProtocol(SecurityProtocol.PLAINTEXT);

    private ReceiverHost() {
    }

    public static void main(String[] args) throws Exception {
        if (args.length < 4) {
            System.err.println(
                    "usage: KCM_JAVA_CONFIG=PROPERTIES ReceiverHost 3.8|4.2 PLUGIN_CLASS CLUSTER_ID BROKER_ID");
            System.exit(2);
        }
        String api = args[0];
        Map<String, Object> config = new HashMap<>();
        // The broker properties come in the environment (java.util.Properties text): on the command line `ps` would
        // show every user the producer's credentials.
        Properties given = new Properties();
        given.load(new StringReader(Objects.requireNonNullElse(System.getenv("KCM_JAVA_CONFIG"), "")));
        for (String name : given.stringPropertyNames()) {
            config.put(name, given.getProperty(name));
        }
        config.put("node.id", args[3]);
        MetricsReporter plugin = (MetricsReporter) Class.forName(args[1]).getDeclaredConstructor().newInstance();
        DataOutputStream out = new DataOutputStream(new BufferedOutputStream(System.out));
        try {
            plugin.configure(config);
            Map<String, String> labels = new HashMap<>();
            // As a KRaft broker (every Kafka 4.x broker) labels its metrics context (Server.createKafkaMetricsContext).
            labels.put("kafka.node.id", args[3]);
            // A broker without a cluster id (none known yet) gives no label rather than an empty one.
            if (!args[2].isEmpty()) {
                labels.put("kafka.cluster.id", args[2]);
            }
            plugin.contextChange(new KafkaMetricsContext("kafka.server", labels));
            Exporter exporter = exporter(api, plugin);
            out.writeByte('R');
            out.flush();
            serve(new DataInputStream(new BufferedInputStream(System.in)), out, exporter);
        } finally {
            plugin.close();
        }
    }

    interface Exporter {
        void export(AuthorizableRequestContext context, ClientTelemetryPayload payload, int pushIntervalMs);
    }

    @SuppressWarnings("removal")
    private static Exporter exporter(String api, MetricsReporter plugin) {
        if (api.equals("4.2")) {
            ClientTelemetryExporter exporter = ((ClientTelemetryExporterProvider) plugin).clientTelemetryExporter();
            return (context, payload, interval) -> exporter.exportMetrics(new ClientTelemetryContext() {
                @Override
                public int pushIntervalMs() {
                    return interval;
                }

                @Override
                public AuthorizableRequestContext authorizableRequestContext() {
                    return context;
                }
            }, payload);
        }
        if (api.equals("3.8")) {
            ClientTelemetryReceiver receiver = ((ClientTelemetry) plugin).clientReceiver();
            return (context, payload, interval) -> receiver.exportMetrics(context, payload);
        }
        throw new IllegalArgumentException("API must be 3.8 or 4.2, not " + api);
    }

    private static void serve(DataInputStream in, DataOutputStream out, Exporter exporter) throws IOException {
        int correlationId = 0;
        while (true) {
            long msb;
            try {
                msb = in.readLong();
            } catch (EOFException closed) {
                return;
            }
            Uuid instance = new Uuid(msb, in.readLong());
            boolean terminating = in.readByte() != 0;
            // RequestHeader.parse: "we treat a null client ID as equivalent to an empty client ID".
            String clientId = Objects.requireNonNullElse(text(in), "");
            String softwareName = text(in);
            String softwareVersion = text(in);
            String address = text(in);
            int port = in.readInt();
            int interval = in.readInt();
            int length = in.readInt();
            byte[] data;
            try {
                data = new byte[length];
            } catch (OutOfMemoryError tooBig) {
                // Answered as failed (the client gets INVALID_RECORD), as the next push must still find its frame.
                discard(in, length);
                fail(out, tooBig);
                out.flush();
                continue;
            }
            in.readFully(data);
            try {
                RequestContext context = new RequestContext(
                        new RequestHeader(ApiKeys.PUSH_TELEMETRY, (short) 0, clientId, correlationId++),
                        address + ":" + port + "-0", address == null ? null : InetAddress.getByName(address),
                        port < 0 ? Optional.empty() : Optional.of(port), KafkaPrincipal.ANONYMOUS, LISTENER,
                        SecurityProtocol.PLAINTEXT,
                        softwareName == null ? ClientInformation.EMPTY
                                : new ClientInformation(softwareName, softwareVersion),
                        false);
                // Kafka hands the plugin a read-only view of the request buffer.
                ByteBuffer view = ByteBuffer.wrap(data).asReadOnlyBuffer();
                exporter.export(context, new Payload(instance, terminating, view), interval);
                out.writeByte(0);
            // What a broker does when the plugin throws: the client is answered INVALID_RECORD. A push the heap
            // cannot hold fails alone, and the host serves on.
            } catch (Exception | OutOfMemoryError error) {
                fail(out, error);
            }
            out.flush();
        }
    }

    private static void fail(DataOutputStream out, Throwable error) throws IOException {
        byte[] message = String.valueOf(error).getBytes(StandardCharsets.UTF_8);
        out.writeByte(1);
        out.writeInt(message.length);
        out.write(message);
    }

    // InputStream.skipNBytes seeks, which a pipe refuses ("Illegal seek"): read the bytes and drop them.
    private static void discard(DataInputStream in, int length) throws IOException {
        byte[] chunk = new byte[8192];
        for (int left = length; left > 0; ) {
            int read = in.read(chunk, 0, Math.min(left, chunk.length));
            if (read < 0) {
                throw new EOFException("stdin ended inside a push");
            }
            left -= read;
        }
    }

    private static String text(DataInputStream in) throws IOException {
        int length = in.readInt();
        if (length < 0) {
            return null;
        }
        byte[] bytes = new byte[length];
        in.readFully(bytes);
        return new String(bytes, StandardCharsets.UTF_8);
    }

    private static final class Payload implements ClientTelemetryPayload {
        private final Uuid instance;
        private final boolean terminating;
        private final ByteBuffer data;

        Payload(Uuid instance, boolean terminating, ByteBuffer data) {
            this.instance = instance;
            this.terminating = terminating;
            this.data = data;
        }

        @Override
        public Uuid clientInstanceId() {
            return instance;
        }

        @Override
        public boolean isTerminating() {
            return terminating;
        }

        @Override
        public String contentType() {
            return CONTENT_TYPE;
        }

        @Override
        public ByteBuffer data() {
            return data;
        }
    }
}
