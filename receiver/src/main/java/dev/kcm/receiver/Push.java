package dev.kcm.receiver;

import org.apache.kafka.common.Uuid;
import org.apache.kafka.common.requests.RequestContext;
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
    /** When the broker handed the push over (epoch ms): the record's timestamp, however long it waits in the queue. */
    final long acceptedMs;
    private final long weight;

    Push(AuthorizableRequestContext context, Uuid clientInstanceId, boolean terminating, String contentType,
         byte[] data, Integer pushIntervalMs) {
        this.context = context;
        this.clientInstanceId = clientInstanceId;
        this.terminating = terminating;
        this.contentType = contentType;
        this.data = data;
        this.pushIntervalMs = pushIntervalMs;
        this.acceptedMs = System.currentTimeMillis();
        this.weight = weightOf(data.length, context);
    }

    /** The allowance for a push's object and headers, so tiny pushes stay bounded too. */
    static final long OVERHEAD = 256L;

    /** Bytes this push holds in the queue. */
    long weight() {
        return weight;
    }

    /**
     * What a push of `dataLength` bytes holds in the queue: its data, the allowance, and the text the client chose
     * that the context keeps for its record (a client id of up to 32 KiB with 1-byte pushes held 134 × the budget).
     */
    static long weightOf(int dataLength, AuthorizableRequestContext context) {
        long text = length(context.clientId());
        if (context instanceof RequestContext full && full.clientInformation != null) {
            text += length(full.clientInformation.softwareName()) + length(full.clientInformation.softwareVersion());
        }
        return dataLength + OVERHEAD + 2 * text;  // two bytes a character at most (Java strings are UTF-16 or Latin-1)
    }

    private static long length(String text) {
        return text == null ? 0 : text.length();
    }
}
