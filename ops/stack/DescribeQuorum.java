// The KRaft metadata quorum as Kafka's Admin client describes it (KIP-836: what `kafka-metadata-quorum describe
// --replication` prints), for `python -m stack rolling-restart`, which waits for a restarted node to be back in the
// quorum: confluent-kafka's admin client has no DescribeQuorum. Run from its source by the Java launcher with Kafka's
// jars on the class path (`stack.rolling.describe_quorum`); the client's properties (bootstrap servers, SASL, TLS)
// come on stdin, so no password is on a command line. Prints one line per replica of the metadata log:
//   leader <id> <epoch> <high watermark>
//   voter|observer <id> <log end offset> <last fetch, ms since the epoch or -1> <last caught up, ms or -1>
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.QuorumInfo;

public class DescribeQuorum {
    public static void main(String[] args) throws Exception {
        Properties properties = new Properties();
        properties.load(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        long timeoutMs = args.length > 0 ? Long.parseLong(args[0]) : 15_000L;
        try (Admin admin = Admin.create(properties)) {
            QuorumInfo quorum = admin.describeMetadataQuorum().quorumInfo().get(timeoutMs, TimeUnit.MILLISECONDS);
            System.out.printf("leader %d %d %d%n", quorum.leaderId(), quorum.leaderEpoch(), quorum.highWatermark());
            print("voter", quorum.voters());
            print("observer", quorum.observers());
        }
    }

    private static void print(String role, List<QuorumInfo.ReplicaState> replicas) {
        for (QuorumInfo.ReplicaState replica : replicas) {
            System.out.printf("%s %d %d %d %d%n", role, replica.replicaId(), replica.logEndOffset(),
                    replica.lastFetchTimestamp().orElse(-1L), replica.lastCaughtUpTimestamp().orElse(-1L));
        }
    }
}
