// Where an object's bytes come from, as the node's daemons compare it before one lends another
// its copy (ObjectSourceFingerprint): a remote file's version is part of it, so that after a
// same-size overwrite a daemon that registered the new version never borrows the old one.
#include "gtest/gtest.h"
#include "storage/model.h"

namespace tierd {
namespace {

ModelInfo RemoteModel(const std::string& etag) {
  ModelInfo model;
  model.name = "m";
  model.directory = "s3://models/m";
  ModelFile& file = model.files.emplace_back();
  file.path = "s3://models/m/model.safetensors";
  file.size = 1 << 20;
  file.etag = etag;
  ObjectInfo& object = model.objects.emplace_back();
  object.name = "blocks.0";
  object.size = 4096;
  object.extents = {Extent{0, 128, 4096, 0}};
  return model;
}

TEST(ObjectSourceFingerprintTest, ARemoteFilesVersionIsPartOfItsObjectsSource) {
  const ModelInfo v1 = RemoteModel("etag-1");
  const ModelInfo v1_again = RemoteModel("etag-1");
  const ModelInfo v2 = RemoteModel("etag-2");
  EXPECT_EQ(ObjectSourceFingerprint(v1, v1.objects[0]),
            ObjectSourceFingerprint(v1_again, v1_again.objects[0]));
  EXPECT_NE(ObjectSourceFingerprint(v1, v1.objects[0]), ObjectSourceFingerprint(v2, v2.objects[0]));
}

}  // namespace
}  // namespace tierd
