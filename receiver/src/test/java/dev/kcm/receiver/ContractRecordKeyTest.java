package dev.kcm.receiver;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;

import org.junit.jupiter.api.Test;

/** The record beside ContractRecordTest's: its partition left to its key, every byte of a magic compared. */
class ContractRecordKeyTest {
    private static final byte[] METRICS = {0x0a, 0x02, 0x0a, 0x00};

    @Test
    void theRecordLeavesThePartitionToItsKey() {
        // The producer's partitioner hashes the client instance id: one client's pushes stay in order on one partition,
        // and clients spread over all of them.
        assertNull(ContractRecord.build("metrics", Fixtures.push(Fixtures.requestContext(), METRICS, null), "1", "c")
                .partition());
    }

    @Test
    void everyByteOfAMagicMustMatch() {
        assertEquals("none", ContractRecord.contentEncoding(new byte[] {0x28, (byte) 0xB5, 0x2F, 0x00, 1}));
        assertEquals("none", ContractRecord.contentEncoding(new byte[] {0x04, 0x22, 0x4D, 0x00, 1}));
        assertEquals("none", ContractRecord.contentEncoding(new byte[] {0x1F, 0x00, 8}));
    }
}
