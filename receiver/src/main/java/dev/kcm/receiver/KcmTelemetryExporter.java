package dev.kcm.receiver;

import org.apache.kafka.server.authorizer.AuthorizableRequestContext;
import org.apache.kafka.server.telemetry.ClientTelemetryContext;
import org.apache.kafka.server.telemetry.ClientTelemetryExporter;
import org.apache.kafka.server.telemetry.ClientTelemetryExporterProvider;
import org.apache.kafka.server.telemetry.ClientTelemetryPayload;

/** The plugin for Kafka 4.2 and later (KIP-1217): {@code metric.reporters=dev.kcm.receiver.KcmTelemetryExporter}. */
public class KcmTelemetryExporter extends ReceiverReporter implements ClientTelemetryExporterProvider {
    private final ClientTelemetryExporter exporter;

    public KcmTelemetryExporter() {
        this(new ReceiverCore());
    }

    KcmTelemetryExporter(ReceiverCore core) {
        super(core);
        this.exporter = this::export;
    }

    private void export(ClientTelemetryContext context, ClientTelemetryPayload payload) {
        AuthorizableRequestContext request;
        Integer pushIntervalMs;
        try {
            request = context.authorizableRequestContext();
            pushIntervalMs = context.pushIntervalMs();
        // A broken context must not reach the broker either (it would answer the client INVALID_RECORD).
        } catch (Throwable error) {
            core.unreadableContext(error);
            return;
        }
        core.export(request, payload, pushIntervalMs);
    }

    @Override
    public ClientTelemetryExporter clientTelemetryExporter() {
        return exporter;
    }
}
