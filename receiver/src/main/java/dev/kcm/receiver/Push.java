package dev.kcm.receiver;

import org.apache.kafka.common.Uuid;
import org.apache.kafka.server.authorizer.AuthorizableRequestContext;

/** One accepted push as captured on the broker's request thread: a copy of the data, the rest by reference. */
final class Push {
    final AuthorizableRequestContext context;
    final Uuid clientInstanceId;
    final boolean terminating;
    final String contentType;
    final byte[] data;
    /** Null before Kafka 4.2, whose receiver API does not give it. */
    final Integer pushIntervalMs;

    Push(AuthorizableRequestContext context, Uuid clientInstanceId, boolean terminating, String contentType,
         byte[] data, Integer pushIntervalMs) {
        this.context = context;
        this.clientInstanceId = clientInstanceId;
        this.terminating = terminating;
        this.contentType = contentType;
        this.data = data;
        this.pushIntervalMs = pushIntervalMs;
    }

    /** The allowance for a push's object and headers, so tiny pushes stay bounded too. */
    static final long OVERHEAD = 256L;

    /** Bytes this push holds in the queue. */
    long weight() {
        return data.length + OVERHEAD;
    }
}
